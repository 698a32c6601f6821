"""Merging the result files of benchmarks/autoscaling_validation_frontier.py (`--merge`): the
replay is deterministic, so a candidate's rows do not depend on which run they came from."""

from __future__ import annotations

import json

from autoscaling.replay.cold_starts import ColdStarts

CONSTANT_120_S = ColdStarts.constant(120.0)  # every start alike: the replay's default


def merge(results: list[dict]) -> tuple[list[dict], dict[str, list[str]], dict[str, str]]:
    """The rows, candidates and recorded settings of several result files on the same splits.
    A candidate in two files must have the same settings in both (a name whose meaning moved
    with the defaults is an error; files written since the eleventh run also record the settings
    each candidate ran with, defaults included, and those must match too); runs on other seeds
    add its rows for those seeds, and a (split, seed) replayed twice is taken from the first
    file."""
    # a file from before --cold-starts replayed every start at 120 s
    starts = {json.dumps(r.get("cold_starts", CONSTANT_120_S.describe())) for r in results}
    if len(starts) > 1:
        raise ValueError(f"--merge: the files replayed other cold starts: {sorted(starts)}")
    rows: list[dict] = []
    seen: set[tuple[str, str, int]] = set()
    candidates: dict[str, list[str]] = {}
    effective: dict[str, str] = {}
    for res in results:
        if res["splits"] != results[0]["splits"]:
            raise ValueError(f"--merge: splits {res['splits']} differ from {results[0]['splits']}")
        for name, settings in res["candidates"].items():
            if candidates.setdefault(name, settings) != settings:
                raise ValueError(
                    f"--merge: candidate {name!r} is {settings} in one file and "
                    f"{candidates[name]} in another"
                )
            ran = res.get("effective", {}).get(name)
            if ran is not None and effective.setdefault(name, ran) != ran:
                raise ValueError(
                    f"--merge: candidate {name!r} ran with other settings in two files (a "
                    f"default moved between the runs): {ran} and {effective[name]}"
                )
            for r in res["rows"]:
                key = (r["candidate"], r["split"], r["seed"])
                if r["candidate"] == name and key not in seen:
                    seen.add(key)
                    rows.append(r)
    return rows, candidates, effective


def fully_replayed(rows: list[dict], names: list[str]) -> list[str]:
    """The candidates replayed on every (split, seed) that any of them was: only those are
    ranked against each other."""
    cover = {n: {(r["split"], r["seed"]) for r in rows if r["candidate"] == n} for n in names}
    everything = set().union(*cover.values())
    return [n for n in names if cover[n] == everything]
