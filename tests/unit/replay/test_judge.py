"""Judging by day (autoscaling/replay/judge.py): per-day violation-minutes, a baseline's per-day
numbers at a given cost, and the 95% t-interval of the per-day differences."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.replay import judge

DAY = judge.DAY_S


def test_per_day_counts_violation_minutes_requests_and_gpu_hours():
    n = 2 * DAY
    arrivals = np.full(n, 10.0)
    ttft = np.full(n, 0.3)
    ttft[100:160] = 2.0  # a minute late on day 1
    refused = np.zeros(n)
    refused[DAY + 5 : DAY + 35] = 1.0  # half a minute refusing on day 2
    scored = np.ones(n, dtype=bool)
    scored[DAY + 30 : DAY + 35] = False  # a gap is not scored
    out = judge.per_day(np.full(n, 2.0), ttft, arrivals, scored, refused, 1.0)
    assert out["violation_minutes"] == pytest.approx([1.0, 25 / 60])
    assert out["gpu_hours"] == pytest.approx([48.0, 48.0])
    assert out["num_slo_violations"] == pytest.approx([600.0, 25.0])
    assert out["num_requests"] == pytest.approx([DAY * 10.0, (DAY - 5) * 10.0])


def row(gpu_hours: float, minutes: list[float]) -> dict:
    return {"gpu_hours": gpu_hours, "per_day": {"violation_minutes": minutes}}


def test_a_baseline_at_a_given_cost_is_linear_between_its_sweep_points():
    rows = [row(200.0, [0.0, 2.0]), row(100.0, [10.0, 20.0])]
    assert judge.at_gpu_hours(rows, 150.0, "violation_minutes").tolist() == [5.0, 11.0]
    assert judge.at_gpu_hours(rows, 100.0, "violation_minutes").tolist() == [10.0, 20.0]
    assert judge.at_gpu_hours(rows, 99.0, "violation_minutes") is None  # no extrapolation


def test_the_95_percent_interval_is_students_t():
    ci = judge.mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * np.std([1, 2, 3, 4, 5], ddof=1) / np.sqrt(5)
    assert ci["mean"] == 3.0 and ci["lo"] == pytest.approx(3 - half) and ci["n"] == 5
    assert judge.mean_ci95([2.0])["lo"] == -np.inf  # one value: no interval
    with pytest.raises(ValueError, match="dof=0"):
        judge.t975(0)


def test_day_differences_are_the_baseline_at_tideserves_cost_minus_tideserve_over_seeds():
    ts = [row(150.0, [1.0, 1.0]), row(150.0, [3.0, 1.0])]
    base = [[row(100.0, [10.0, 20.0]), row(200.0, [0.0, 2.0])]] * 2
    # the baseline at 150: [5, 11]; minus tideserve per seed: [4, 10] and [2, 10]; mean [3, 10]
    assert judge.day_differences(ts, base).tolist() == [3.0, 10.0]
    assert judge.day_differences([row(300.0, [0.0, 0.0])], base[:1]) is None
    # cheaper than the baseline's cheapest point: that point stands in (conservative)
    assert judge.day_differences([row(90.0, [1.0, 1.0])], base[:1]).tolist() == [9.0, 19.0]
