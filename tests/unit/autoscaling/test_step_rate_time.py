"""step.tick files a rate under the time it was measured, not the time it arrived."""

from __future__ import annotations

import pytest

from autoscaling import step
from autoscaling.forecast import Forecast, Forecaster
from autoscaling.headroom import HeadroomLearner
from autoscaling.policy import PolicyConfig, PolicyState

DAY = 86400.0
NOON = 12 * 3600.0


def stepped(t_s: float) -> float:
    """1 rps all day, 3 rps from 12:00: the ramp a compressed day replays in seconds."""
    return 3.0 if t_s % DAY >= NOON else 1.0


def trained() -> Forecaster:
    f = Forecaster()
    t = 300.0
    while t < 3 * DAY:
        f.observe(t, stepped(t))
        t += 600.0
    return f


def forecast_after(reports: list[tuple[float, float, float | None]]) -> Forecast:
    """Tick on (now, rate, measured at) and return the last tick's forecast."""
    f, learner, state = trained(), HeadroomLearner(), PolicyState()
    cfg = PolicyConfig(replica_capacity_rps=1.0, max_cold_replicas=8)
    fc = None
    for now, rate, at in reports:
        seen = step.Observed(rate, 1, 0, 0, 0, 0.0, rate_at_s=at)
        _, state, fc = step.tick(f, learner, state, cfg, seen, now)
    assert fc is not None
    return fc


def test_a_late_report_of_the_level_before_a_ramp_is_not_read_as_a_drop():
    day3 = 3 * DAY
    # Ticks every 10 min from 11:00; each reports the rate counted over the 10 minutes that
    # ended 10 minutes before it (a slow report path). At 12:10 the 1 rps it reports was
    # counted from 11:50 to 12:00, before the ramp.
    ticks = [day3 + NOON + m * 60.0 for m in range(-60, 11, 10)]
    late = [(t, stepped(t - 900.0), t - 900.0) for t in ticks]
    stamped_now = [(t, r, None) for t, r, _ in late]
    on_time, as_arrived = forecast_after(late), forecast_after(stamped_now)
    # Filed under its arrival time the old 1 rps reads as a third of the 3 rps the profile
    # expects by then: the level drops, and with it the peak the plan sizes the pool for.
    assert "level 0.75" in on_time.basis  # the profile's smoothing of the step, no more
    assert "level 0.50" in as_arrived.basis
    # the profile's share (profile_weight, half) falls by a third; the carried minute's does not
    assert as_arrived.peak_rps < 0.8 * on_time.peak_rps


def test_a_rate_time_in_the_future_is_filed_now():
    f, learner = trained(), HeadroomLearner()
    cfg = PolicyConfig(replica_capacity_rps=1.0, queue_tail_share=0.0)  # the arithmetic alone
    now = 3 * DAY + 6 * 3600.0
    seen = step.Observed(1.0, 1, 0, 0, 0, 0.0, rate_at_s=now + 600.0)
    decision, _, fc = step.tick(f, learner, PolicyState(), cfg, seen, now)
    assert fc.level_rps == pytest.approx(1.0)
    assert decision.cold_target == 1  # 1 rps x 1/0.85 on 1 rps replicas: hot + 1 cold
