"""The validation frontier's T3a statistic: per-day differences pooled over the splits' days."""

from __future__ import annotations

import pytest

from benchmarks.autoscaling_validation_frontier import _days_ci


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
