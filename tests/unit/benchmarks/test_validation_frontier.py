"""The validation frontier's T3a statistic: per-day differences pooled over the splits' days."""

from __future__ import annotations

import pytest

from benchmarks.autoscaling_validation_frontier import _days_ci, fully_replayed, merge, rank


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


def summary(t1: float, lo: float | None, beating: int, cost: float) -> dict:
    ci = None if lo is None else {"mean": lo + 1.0, "lo": lo, "hi": lo + 2.0, "n": 10}
    return {
        "t1_share": t1,
        "violation_minutes_fewer_than_knative_per_day": ci,
        "num_beating_knative": beating,
        "mean_to_99_5_over_oracle": cost,
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


def result(candidates: dict[str, list[str]], seed: int = 0, splits=("a",)) -> dict:
    rows = [{"candidate": c, "split": sp, "seed": seed} for c in candidates for sp in splits]
    return {"splits": list(splits), "candidates": candidates, "rows": rows}


def test_merge_takes_each_candidates_rows_once_from_runs_on_the_same_splits():
    rows, candidates = merge([result({"x": ["1"], "y": ["2"]}), result({"y": ["2"], "z": ["3"]})])
    assert list(candidates) == ["x", "y", "z"]
    assert [r["candidate"] for r in rows] == ["x", "y", "z"]


def test_runs_on_other_seeds_add_rows_and_only_candidates_on_every_seed_are_ranked():
    rows, candidates = merge([result({"x": ["1"], "y": ["2"]}), result({"x": ["1"]}, seed=2)])
    assert sorted((r["candidate"], r["seed"]) for r in rows) == [("x", 0), ("x", 2), ("y", 0)]
    assert fully_replayed(rows, list(candidates)) == ["x"]


def test_merge_refuses_other_splits_or_a_name_whose_settings_moved():
    with pytest.raises(ValueError, match="splits"):
        merge([result({"x": ["1"]}), result({"y": ["2"]}, splits=("b",))])
    with pytest.raises(ValueError, match="candidate 'defaults'"):
        merge([result({"defaults": ["tail 0.05"]}), result({"defaults": ["tail 0.5"]})])
