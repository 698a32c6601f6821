"""T2 on validation data: GPU-hours to reach 99.5% in SLO, tideserve's candidates against Knative.

    python benchmarks/autoscaling_validation_frontier.py [--quick] [--json PATH] [--jobs N]
                                                         [--seeds N] [--first-seed K]
                                                         [--candidates NAME ...]
                                                         [--cold-starts FILE]
    python benchmarks/autoscaling_validation_frontier.py --merge A.json B.json --json OUT.json

The splits are the protocol's validation splits (autoscaling/replay/protocol.validation_splits,
gated by `for_tuning`): the synthetic shapes' rolling origins and the shared traces' training
week (train 1-5, judge 6-7); the shared traces' test days cannot be replayed here. Arrivals are
interpolated; seed k draws its own Poisson arrivals and moves the curve k x 137 s later.

Per split and seed: Knative swept over its concurrency target (utilisation 0.8-0.95) and each
candidate's tideserve swept over its headroom quantile, both read where their frontier reaches
99.5% (autoscaling/replay/frontier.gpu_hours_to_reach, interpolated between sweep points), as a
multiple of the oracle's GPU-hours; and the candidate at its default quantile (T1). Knative and
the oracle do not depend on the candidate and run once per split. Per candidate: its share of
replays meeting T1, the replays where it needs fewer GPU-hours than Knative to reach 99.5%, its
mean cost to 99.5%, and T3a's statistic on these days: Knative's violation-minutes at the default
quantile's GPU-hours minus the candidate's, per judged day (autoscaling/replay/judge.py), with a
95% interval over every split's days. The rule
is `rank` (the summary's "ranking", best first), with T3a in it since the tenth tuning run: T1
share, then T3a's interval above 0, then the splits beating Knative, then the mean cost, where
a cost within the noise of the cheapest's ties and the tie goes to T3a's lower bound (since the
eleventh).
--quick: the shared traces' two splits, one seed, two candidates. --merge ranks together the
candidates of earlier runs on the same splits (the replay is deterministic, so a candidate's rows
do not depend on which run they came from); a run on other seeds adds those seeds, and only the
candidates replayed on every seed are ranked. It replays nothing, and refuses files whose cold
starts differ. --cold-starts FILE: each replica start draws its length from a
benchmarks/cold_start.py result's trials (autoscaling/replay/cold_starts.py), not 120 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaling.forecast import ForecastConfig
from autoscaling.headroom import HeadroomConfig
from autoscaling.policy import PolicyConfig
from autoscaling.replay import judge
from autoscaling.replay.cold_starts import ColdStarts
from autoscaling.replay.frontier import Sweep, gpu_hours_to_reach, run_sweeps
from autoscaling.replay.protocol import validation_splits
from autoscaling.replay.runner import ReplaySettings, prepare
from autoscaling.replay.service import ServiceModel
from benchmarks._common import log, machine_info, write_json
from benchmarks._validation_candidates import CANDIDATES
from benchmarks._validation_merge import CONSTANT_120_S, fully_replayed, merge
from benchmarks._validation_rank import rank
from benchmarks.autoscaling_shapes import shapes
from benchmarks.autoscaling_validation import PHASE_STEP_S, _trace

SLO = 0.995
# below 0.98 too: with the queue margin the frontier's cheap end lies under the old sweep
QUANTILES = (0.9, 0.95, 0.98, 0.99, 0.995)
KNATIVE_UTILS = (0.8, 0.85, 0.875, 0.9, 0.95)


def _over_oracle(rows: list[dict], oracle_gpu_hours: float) -> float | None:
    g = gpu_hours_to_reach(rows, SLO)
    return None if g is None else g / oracle_gpu_hours


def _base_policy() -> PolicyConfig:
    """The policy every split replays: the service model's 20 rps a replica, a 1 s TTFT SLO."""
    return PolicyConfig(replica_capacity_rps=20.0, ttft_slo_s=1.0)


def _settings(name: str) -> tuple[HeadroomConfig, PolicyConfig, ForecastConfig]:
    """What candidate `name` runs with: its overrides on this code's defaults."""
    head_kw, pol_kw, fc_kw = CANDIDATES[name]
    cfg = replace(_base_policy(), **pol_kw)
    return replace(HeadroomConfig(), **head_kw), cfg, replace(ForecastConfig(), **fc_kw)


def run_split(
    split, seed: int, names: list[str], jobs: int, starts: ColdStarts = CONSTANT_120_S
) -> list[dict]:
    svc = ServiceModel(20.0)
    full = svc.replica_capacity_rps * svc.mean_e2e_s  # in flight at capacity
    base = ReplaySettings(
        scale_to_peak_replicas=20,
        cold_start_s=starts.median_s,
        cold_starts=starts,
        seed=seed,
        arrival_shape="interpolated",
        phase_s=(seed * PHASE_STEP_S) % 600,
    )
    cfg0 = _base_policy()
    s0 = split.settings(base)
    trace = _trace(split.source)
    knots = tuple(round(u * full, 1) for u in KNATIVE_UTILS)
    peers = (Sweep("knative", "target_concurrency", knots), Sweep("oracle", "none", (0.0,)))
    ref = run_sweeps(prepare(trace, cfg0, s0), cfg0, svc, s0, peers, jobs=jobs)
    oracle = ref["oracle"][0]["gpu_hours"]
    knative = _over_oracle(ref["knative"], oracle)
    out = []
    for name in names:
        head, cfg, fc = _settings(name)
        s = replace(s0, headroom=head, forecast=fc)
        rows = run_sweeps(
            prepare(trace, cfg, s), cfg, svc, s, (Sweep("tideserve", "q", QUANTILES),), jobs=jobs
        )["tideserve"]
        at_default = next(r for r in rows if r["value"] == s.headroom.quantile)
        ts = _over_oracle(rows, oracle)
        row = {
            "candidate": name,
            "split": split.label,
            "seed": seed,
            "tideserve_to_99_5_over_oracle": ts,
            "knative_to_99_5_over_oracle": knative,
            "beats_knative": ts is not None and (knative is None or ts < knative),
            "default_quantile": {
                "slo_attainment": at_default["slo_attainment"],
                "gpu_hours_over_oracle": at_default["gpu_hours"] / oracle,
            },
            "frontier": [[r["value"], r["slo_attainment"], r["gpu_hours"] / oracle] for r in rows],
        }
        # T3a's statistic on validation: Knative at the default's GPU-hours, per day, minus it
        diffs = judge.day_differences([at_default], [ref["knative"]])
        row["violation_minutes_fewer_than_knative_by_day"] = (
            None if diffs is None else diffs.tolist()
        )
        d = row["default_quantile"]
        d["t1"] = d["slo_attainment"] >= SLO and d["gpu_hours_over_oracle"] <= 1.15
        kn = "none" if knative is None else f"{knative:.3f}"
        log(f"{name} {split.label} seed {seed}: to 99.5% {ts or float('nan'):.3f} (Knative "
            f"{kn}); default q {100 * d['slo_attainment']:.2f}% at "
            f"{d['gpu_hours_over_oracle']:.3f}x")  # fmt: skip
        out.append(row)
    return out


def _days_ci(rows: list[dict]) -> dict | None:
    """Mean and 95% interval over the splits' days (each split's seeds averaged per day, as
    targets.across_seeds does); None when some split's Knative sweep missed the default's cost."""
    by_split: dict[str, list[list[float]]] = {}
    for r in rows:
        days = r.get("violation_minutes_fewer_than_knative_by_day")
        if days is None:
            return None
        by_split.setdefault(r["split"], []).append(days)
    days = [d for seeds in by_split.values() for d in np.mean(seeds, axis=0).tolist()]
    return judge.mean_ci95(days) if days else None


def summarise(rows: list[dict], names: list[str]) -> dict:
    summary = {}
    for name in names:
        mine = [r for r in rows if r["candidate"] == name]
        costs = [r["tideserve_to_99_5_over_oracle"] for r in mine]
        at = [r["default_quantile"] for r in mine]
        summary[name] = {
            "num_replays": len(mine),
            "num_beating_knative": int(sum(r["beats_knative"] for r in mine)),
            "mean_to_99_5_over_oracle": float(np.mean([c for c in costs if c is not None])),
            # per replay, so `rank` can pair two candidates' costs on the same split and seed
            "to_99_5_by_replay": [
                [r["split"], r["seed"], c] for r, c in zip(mine, costs, strict=True)
            ],
            "num_never_reaching_99_5": sum(c is None for c in costs),
            "t1_share": float(np.mean([r["default_quantile"]["t1"] for r in mine])),
            # where the default quantile sits on the frontier: its cost and its thinnest SLO
            "mean_default_gpu_hours_over_oracle": float(
                np.mean([d["gpu_hours_over_oracle"] for d in at])
            ),
            "lowest_default_slo_attainment": min(d["slo_attainment"] for d in at),
            # T3a on validation: every judged day of every split, Knative at equal cost minus it
            "violation_minutes_fewer_than_knative_per_day": _days_ci(mine),
        }
        print(name, summary[name])
    kn = [r["knative_to_99_5_over_oracle"] for r in rows if r["candidate"] == names[0]]
    summary["ranking"] = rank({name: summary[name] for name in names})
    print("ranking, best first:", summary["ranking"])
    summary["knative"] = {"mean_to_99_5_over_oracle": float(np.mean([k for k in kn if k]))}
    return summary


def merge_main(paths: list[str], json_path: str | None) -> int:
    """--merge: rank the candidates of earlier result files together; replays nothing."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    rows, candidates, effective = merge(results)
    keep = ("benchmark", "quick", "splits", "quantiles")
    out = {k: results[0][k] for k in keep} | {"merged_from": paths}
    out["cold_starts"] = results[0].get("cold_starts", CONSTANT_120_S.describe())
    out["seeds"] = sorted({r["seed"] for r in rows})
    out["machine_info"] = [r.get("machine_info") for r in results]
    # the recorded settings go on, so a merged file merged again is checked as its sources were
    out |= {"candidates": candidates, "effective": effective, "rows": rows}
    ranked = fully_replayed(rows, list(candidates))
    out["not_ranked"] = [n for n in candidates if n not in ranked]  # fewer seeds than others
    out["summary"] = summarise(rows, ranked)
    if json_path:
        write_json(json_path, out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shared splits, one seed, 2 candidates")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument("--merge", nargs="+", default=None, help="rank earlier runs' candidates")
    ap.add_argument(
        "--cold-starts",
        default=None,
        help="a benchmarks/cold_start.py result: each start draws one of its trials (default: "
        "every start takes 120 s)",
    )
    args = ap.parse_args()
    if args.merge:
        return merge_main(args.merge, args.json)
    t0 = time.perf_counter()
    names = args.candidates[:2] if args.quick else args.candidates
    splits = validation_splits([] if args.quick else list(shapes()))
    seeds = 1 if args.quick else args.seeds
    rows: list[dict] = []
    out = {"benchmark": "autoscaling_validation_frontier", "quick": args.quick, "seeds": seeds}
    out["first_seed"] = args.first_seed
    out["splits"] = [sp.label for sp in splits]
    out["candidates"] = {c: [repr(x) for x in CANDIDATES[c]] for c in names}
    out["effective"] = {c: repr(_settings(c)) for c in names}  # defaults included
    out["quantiles"], out["knative_utilisations"] = QUANTILES, KNATIVE_UTILS
    out["machine_info"] = machine_info("cpu", "float64 (numpy replay)")
    starts = ColdStarts.load(args.cold_starts, CONSTANT_120_S.median_s)
    out["cold_starts"] = starts.describe()
    for k in range(args.first_seed, args.first_seed + seeds):
        for sp in splits:
            rows += run_split(sp, k, names, args.jobs, starts)
            out["rows"], out["wall_s"] = rows, time.perf_counter() - t0
            if args.json:  # rewritten after every split: a run cut short keeps what it did
                write_json(args.json, out)
    out["summary"] = summarise(rows, names)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
