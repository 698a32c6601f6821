"""The frontier's present-rate reference: decide() told each window's true rate, fixed headroom.

It is a yardstick, so what it knows must be exactly what its doc says: the true mean of the
window the last interval fell in (never the next one), and nothing else.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.policy import PolicyConfig
from autoscaling.replay.reference import PresentRateController
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.sim import Observation, simulate

CFG = PolicyConfig(replica_capacity_rps=20.0, hot_replicas=1, max_cold_replicas=40)


def steps(*rates: float, bin_s: int = 600) -> np.ndarray:
    return np.repeat(np.array(rates, dtype=float), bin_s)


def controller(arrivals: np.ndarray, headroom: float = 1.5) -> PresentRateController:
    return PresentRateController(CFG, arrivals, 0.0, 600, headroom, 10, 120.0)


def calm() -> Observation:
    """One hot replica up, nothing queued."""
    return Observation(rate_rps=None, queue_depth=0.0, queue_wait_s=0.0, hot_ready=1,
                       cold_ready=0, cold_starting=0)  # fmt: skip


def test_it_knows_the_window_of_the_last_interval_and_not_the_next_one():
    ctl = controller(steps(100.0, 300.0))
    assert ctl.true_rate_rps(590.0) == 100.0
    # the tick at the edge saw the interval before it: the step is not known yet
    assert ctl.true_rate_rps(600.0) == 100.0
    assert ctl.true_rate_rps(610.0) == 300.0


def test_it_plans_the_true_rate_times_its_fixed_headroom():
    ctl = controller(steps(100.0, 100.0), headroom=1.6)
    targets = ctl.tick(300.0, calm())
    # 100 rps x 1.6 = 160 rps: 8 replicas of 20 rps, one of them hot
    assert targets.cold == 7
    assert targets.forecast_rps == pytest.approx(160.0)


def test_a_step_it_did_not_cover_still_costs_it_a_cold_start():
    arrivals = steps(100.0, 100.0, 200.0, 200.0)
    svc = ServiceModel(20.0)
    res = simulate(controller(arrivals, headroom=1.2), arrivals, arrivals, 0.0, svc, 10, 120.0)
    late = res.ttft_s[1200:1320] > 1.0  # the first cold start after the doubling
    assert late.mean() > 0.5
    # once the replicas asked for at the step are up, the queue drains and the SLO holds again
    assert (res.ttft_s[1500:2400] <= 1.0).all()


def test_a_non_positive_headroom_is_an_error_naming_it():
    with pytest.raises(ValueError, match="headroom=0"):
        controller(steps(100.0), headroom=0.0)


def test_a_trace_ending_mid_window_knows_that_last_short_windows_true_rate():
    arrivals = np.r_[steps(100.0), np.full(300, 200.0)]
    assert controller(arrivals).true_rate_rps(910.0) == 200.0


def test_no_arrivals_is_an_error_naming_them():
    with pytest.raises(ValueError, match="arrivals is empty"):
        controller(np.array([]))


def test_the_next_window_reference_is_told_the_next_mean_a_cold_start_before_its_edge():
    arrivals = steps(100.0, 300.0, 50.0)
    ahead = PresentRateController(CFG, arrivals, 0.0, 600, 1.5, 10, 120.0, "next", ahead_s=130.0)
    assert ahead.true_rate_rps(460.0) == 100.0  # 590 s: the next window is not told yet
    assert ahead.true_rate_rps(470.0) == 300.0  # 600 s = 470 + 130: told it now
    # a step down is not planned early: the higher of the two rates holds until the edge passes
    assert ahead.true_rate_rps(1090.0) == 300.0 and ahead.true_rate_rps(1220.0) == 50.0
    with pytest.raises(ValueError, match="ahead_s=-1"):
        PresentRateController(CFG, arrivals, 0.0, 600, 1.5, 10, 120.0, ahead_s=-1.0)
