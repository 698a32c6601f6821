"""Surprises in the replay: the forecast learned 7 ordinary days, day 8 breaks the pattern.

One synthetic daily cycle (100 rps mean, 50 to 150 rps; 20 rps per replica), Poisson arrivals,
120 s cold start, the default policy settings. Each test names what the eighth day does and what
the policy must still deliver: the SLO, through the learned headroom and the emergency path, at a
cost that follows the traffic rather than the memory of it.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.policy import PolicyConfig
from autoscaling.replay.runner import ReplaySettings, run_replay
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.traces import RateTrace

DAY_BINS = 144  # 600 s windows
HOURS = np.arange(8 * DAY_BINS) / 6.0  # hour of the window start since day 1, 00:00
CFG = PolicyConfig(replica_capacity_rps=20.0, ttft_slo_s=1.0)
SVC = ServiceModel(20.0)
SETTINGS = ReplaySettings(policies=("tideserve", "oracle"), cold_start_s=120.0, train_days=7.0)


def ordinary() -> np.ndarray:
    """50 rps at 02:00 to 150 rps at 14:00, every day."""
    return 100.0 - 50.0 * np.cos(2 * np.pi * (HOURS - 2.0) / 24.0)


def day8(rates: np.ndarray, from_h: float, to_h: float, factor: float) -> np.ndarray:
    out = rates.copy()
    hours = HOURS - 7 * 24  # hours into day 8
    hit = (hours >= from_h) & (hours < to_h)
    out[hit] *= factor
    return out


def replay(rates: np.ndarray) -> dict[str, dict]:
    """Per policy: its report row, plus its per-second GPU-holding replicas under "replicas"."""
    trace = RateTrace("synthetic", "rate_series", 600.0, 0.0, rates)
    report, results, _ = run_replay(trace, CFG, SVC, SETTINGS)
    return {row["name"]: row | {"replicas": results[row["name"]].replicas} for row in
            report["policies"]}  # fmt: skip


@pytest.fixture(scope="module")
def usual() -> dict[str, dict]:
    return replay(ordinary())


def test_an_ordinary_day_meets_the_slo_near_the_oracles_cost(usual):
    ts, oracle = usual["tideserve"], usual["oracle"]
    # the SLO's share (quantile 0.995): on a calm day the SLO feedback spends what lies above it
    # on fewer replicas (measured: 99.66% at 0.90x the oracle's GPU-hours; 99.87% at 0.92x before)
    assert ts["slo_attainment"] >= 0.995
    assert ts["gpu_hours"] <= 1.3 * oracle["gpu_hours"]


def test_a_level_shift_at_noon_is_followed_within_the_slo():
    rows = replay(day8(ordinary(), 12.0, 24.0, 1.6))  # 60% more traffic from noon, for good
    ts, oracle = rows["tideserve"], rows["oracle"]
    assert ts["slo_attainment"] >= 0.99
    assert ts["gpu_hours"] <= 1.35 * oracle["gpu_hours"]


def test_a_missed_burst_triggers_the_emergency_and_the_pool_comes_back_down(usual):
    rows = replay(day8(ordinary(), 15.0, 15.5, 2.5))  # half an hour at 2.5x, unforeseeable
    ts = rows["tideserve"]
    assert ts["num_emergencies"] >= 1
    # the burst's first cold start is lost time (about 2 of the 30 minutes); the rest is served
    assert ts["slo_attainment"] >= 0.98
    # in the burst the pool grows well past the ordinary day's; by the evening it is back near it
    # (a little above: the burst is now among the errors the headroom of that hour learns from)
    burst, evening = slice(15 * 3600 + 600, 15 * 3600 + 1800), slice(20 * 3600, 24 * 3600)
    assert ts["replicas"][burst].mean() >= 1.8 * usual["tideserve"]["replicas"][burst].mean()
    assert ts["replicas"][evening].mean() <= 1.25 * usual["tideserve"]["replicas"][evening].mean()


def test_a_holiday_like_quiet_day_costs_a_fraction_of_an_ordinary_one(usual):
    rows = replay(day8(ordinary(), 0.0, 24.0, 0.3))  # the whole day at 30%
    ts = rows["tideserve"]
    assert ts["slo_attainment"] >= 0.999
    assert ts["gpu_hours"] <= 0.55 * usual["tideserve"]["gpu_hours"]


def test_hour_long_rate_steps_every_day_are_learned():
    # 60 and 140 rps, flipping every hour, on every day: the profile knows the steps are coming,
    # but the 10-minute profile smooths each edge, so some up-steps still go to the emergency path
    rows = replay(np.where((HOURS.astype(int) % 2) == 0, 60.0, 140.0))
    ts, oracle = rows["tideserve"], rows["oracle"]
    assert ts["slo_attainment"] >= 0.985
    assert ts["gpu_hours"] <= 1.5 * oracle["gpu_hours"]
