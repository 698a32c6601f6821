"""The validation frontier's T3a statistic: per-day differences pooled over the splits' days."""

from __future__ import annotations

import pytest

from benchmarks._validation_merge import CONSTANT_120_S, fully_replayed, merge
from benchmarks._validation_rank import rank
from benchmarks.autoscaling_validation_frontier import _days_ci, summarise


def row(split: str, days: list[float] | None) -> dict:
    return {"split": split, "violation_minutes_fewer_than_knative_by_day": days}


def test_a_splits_seeds_are_averaged_per_day_then_every_splits_days_are_pooled():
    rows = [row("a", [1.0, 3.0]), row("a", [3.0, 5.0]), row("b", [6.0])]
    ci = _days_ci(rows)
    # split a's days average to 2 and 4 over its seeds; split b adds its one day, 6
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(4.0)
    assert ci["lo"] < 4.0 < ci["hi"]


def test_a_split_whose_knative_sweep_missed_the_cost_leaves_no_interval():
    assert _days_ci([row("a", [1.0]), row("b", None)]) is None


def summary(
    t1: float, lo: float | None, beating: int, cost: float, by_replay: list | None = None
) -> dict:
    """by_replay: the cost to 99.5% on replays a, b, c (seed 0); `cost` on each by default."""
    ci = None if lo is None else {"mean": lo + 1.0, "lo": lo, "hi": lo + 2.0, "n": 10}
    costs = [cost] * 3 if by_replay is None else by_replay
    return {
        "t1_share": t1,
        "violation_minutes_fewer_than_knative_per_day": ci,
        "num_beating_knative": beating,
        "mean_to_99_5_over_oracle": cost,
        "to_99_5_by_replay": [[sp, 0, c] for sp, c in zip("abc", costs, strict=True)],
    }


def test_the_rule_ranks_t1_first_then_t3a_then_the_replays_beating_knative_then_cost():
    ranked = rank(
        {
            "cheapest_but_misses_t1": summary(0.9, 1.0, 20, 0.80),
            "beats_knative_most_but_not_t3a": summary(1.0, -0.1, 20, 0.85),
            "no_t3a_interval": summary(1.0, None, 20, 0.86),
            "t3a_fewer_wins": summary(1.0, 0.2, 17, 0.86),
            "t3a_more_wins": summary(1.0, 0.1, 19, 0.90),
            "t3a_more_wins_cheaper": summary(1.0, 0.1, 19, 0.89),
        }
    )
    assert ranked == [
        "t3a_more_wins_cheaper",
        "t3a_more_wins",
        "t3a_fewer_wins",
        "beats_knative_most_but_not_t3a",
        "no_t3a_interval",
        "cheapest_but_misses_t1",
    ]


def test_a_cost_within_the_seeds_noise_ties_and_the_tie_goes_to_t3as_lower_bound():
    # b is dearer on average, but its paired differences (+0.002, -0.004, +0.005) reach 0
    cheap = summary(1.0, 0.5, 19, 0.901, [0.900, 0.905, 0.898])
    tied_larger_t3a = summary(1.0, 1.5, 19, 0.902, [0.902, 0.901, 0.903])
    assert rank({"cheap": cheap, "tied_larger_t3a": tied_larger_t3a}) == [
        "tied_larger_t3a",
        "cheap",
    ]


def test_a_cost_shown_higher_on_the_paired_replays_is_not_tied_whatever_its_t3a():
    cheap = summary(1.0, 0.5, 19, 0.900, [0.899, 0.900, 0.901])
    dearer = summary(1.0, 3.0, 19, 0.911, [0.910, 0.911, 0.912])
    assert rank({"dearer": dearer, "cheap": cheap}) == ["cheap", "dearer"]


def test_past_the_cheapest_ones_tie_the_rest_is_ranked_the_same_way():
    cheap = summary(1.0, 0.5, 19, 0.900, [0.899, 0.900, 0.901])
    dear = summary(1.0, 0.1, 19, 0.920, [0.918, 0.921, 0.921])
    dear_tied_larger_t3a = summary(1.0, 2.0, 19, 0.921, [0.922, 0.920, 0.921])
    ranked = rank({"dear": dear, "dear_tied_larger_t3a": dear_tied_larger_t3a, "cheap": cheap})
    assert ranked == ["cheap", "dear_tied_larger_t3a", "dear"]


def test_only_replays_both_reached_are_paired_and_one_pair_is_no_tie():
    cheap = summary(1.0, 0.5, 19, 0.900, [0.900, None, None])
    near_but_one_pair = summary(1.0, 3.0, 19, 0.9001, [0.9001, 0.95, 0.97])
    assert rank({"near_but_one_pair": near_but_one_pair, "cheap": cheap}) == [
        "cheap",
        "near_but_one_pair",
    ]


def result(candidates: dict[str, list[str]], seed: int = 0, splits=("a",)) -> dict:
    rows = [{"candidate": c, "split": sp, "seed": seed} for c in candidates for sp in splits]
    return {"splits": list(splits), "candidates": candidates, "rows": rows}


def test_merge_takes_each_candidates_rows_once_from_runs_on_the_same_splits():
    rows, candidates, _ = merge(
        [result({"x": ["1"], "y": ["2"]}), result({"y": ["2"], "z": ["3"]})]
    )
    assert list(candidates) == ["x", "y", "z"]
    assert [r["candidate"] for r in rows] == ["x", "y", "z"]


def test_runs_on_other_seeds_add_rows_and_only_candidates_on_every_seed_are_ranked():
    rows, candidates, _ = merge([result({"x": ["1"], "y": ["2"]}), result({"x": ["1"]}, seed=2)])
    assert sorted((r["candidate"], r["seed"]) for r in rows) == [("x", 0), ("x", 2), ("y", 0)]
    assert fully_replayed(rows, list(candidates)) == ["x"]


def test_merge_refuses_other_splits_or_a_name_whose_settings_moved():
    with pytest.raises(ValueError, match="splits"):
        merge([result({"x": ["1"]}), result({"y": ["2"]}, splits=("b",))])
    with pytest.raises(ValueError, match="candidate 'defaults'"):
        merge([result({"defaults": ["tail 0.05"]}), result({"defaults": ["tail 0.5"]})])


def test_merge_refuses_files_that_replayed_other_cold_starts():
    measured = result({"x": ["1"]}, seed=1)
    measured["cold_starts"] = {"source": "cold_start.json", "samples_s": [18.3, 52.4]}
    with pytest.raises(ValueError, match="other cold starts"):
        merge([result({"x": ["1"]}), measured])
    at_120 = result({"x": ["1"]}, seed=1)
    at_120["cold_starts"] = CONSTANT_120_S.describe()  # what a file from before the key meant
    rows, _, _ = merge([result({"x": ["1"]}), at_120])
    assert len(rows) == 2


def test_merge_refuses_a_candidate_that_ran_with_other_defaults_when_both_files_say():
    before, after, unrecorded = (result({"defaults": ["{}"]}) for _ in range(3))
    before["effective"] = {"defaults": "HeadroomConfig(extrapolate_volatility_above=0.0)"}
    after["effective"] = {"defaults": "HeadroomConfig(extrapolate_volatility_above=0.99)"}
    with pytest.raises(ValueError, match="a default moved"):
        merge([before, after])
    rows, _, effective = merge([before, unrecorded])  # an unrecorded file: its names are trusted
    assert len(rows) == 1
    assert effective == before["effective"]  # and what was recorded goes on to the merged file


def replay_row(split: str, seed: int, slo: float, gpu: float, to_99_5: float) -> dict:
    at = {"slo_attainment": slo, "gpu_hours_over_oracle": gpu, "t1": slo >= 0.995}
    return {
        "candidate": "c",
        "split": split,
        "seed": seed,
        "tideserve_to_99_5_over_oracle": to_99_5,
        "knative_to_99_5_over_oracle": 0.95,
        "beats_knative": to_99_5 < 0.95,
        "default_quantile": at,
        "violation_minutes_fewer_than_knative_by_day": [1.0, 2.0],
    }


def test_the_summary_says_where_the_default_quantile_sits_its_cost_and_thinnest_slo():
    rows = [replay_row("a", 0, 0.998, 0.93, 0.90), replay_row("b", 0, 0.9951, 0.91, 0.92)]
    s = summarise(rows, ["c"])["c"]
    assert s["mean_default_gpu_hours_over_oracle"] == pytest.approx(0.92)
    assert s["lowest_default_slo_attainment"] == 0.9951
    assert (s["t1_share"], s["num_beating_knative"]) == (1.0, 2)
