"""PolicyConfig.for_cold_start: the plan's time protections shrink with a shorter measured start."""

from __future__ import annotations

import pytest

from autoscaling import step
from autoscaling.forecast import Forecaster
from autoscaling.headroom import HeadroomLearner
from autoscaling.policy import PolicyConfig, PolicyState, lead_s_for
from autoscaling.policy_config import SCALED_WITH_COLD_START, TIME_PROTECTIONS
from serving.config import AppConfig

FIT_AT_S = 120.0


def scaling() -> PolicyConfig:
    return PolicyConfig(replica_capacity_rps=10.0, protections_fit_at_cold_start_s=FIT_AT_S)


def test_a_start_at_the_fit_length_or_longer_runs_the_settings_unchanged():
    cfg = scaling()
    assert cfg.for_cold_start(FIT_AT_S) is cfg
    assert cfg.for_cold_start(600.0) is cfg  # never grown past what was fit
    assert cfg.for_cold_start(None) is cfg  # no start measured yet


def test_scaling_off_by_default_keeps_every_protection_whatever_the_start():
    cfg = PolicyConfig(replica_capacity_rps=10.0)
    assert cfg.protections_fit_at_cold_start_s == 0.0
    assert cfg.for_cold_start(12.0) is cfg


def test_a_start_at_a_quarter_of_the_fit_length_quarters_each_time_protection():
    cfg = scaling()
    short = cfg.for_cold_start(FIT_AT_S / 4)
    for name in SCALED_WITH_COLD_START:
        assert getattr(short, name) == pytest.approx(getattr(cfg, name) / 4), name
    # the trend's window is a filter of the rate's noise, not a wait for a start: kept
    assert short.trend_window_s == cfg.trend_window_s
    # shares and counts are not spans of time: untouched
    assert short.queue_tail_share == cfg.queue_tail_share
    assert short.scale_down_tail_share == cfg.scale_down_tail_share
    assert short.panic_hold_s == cfg.panic_hold_s
    assert short.rate_window_s == cfg.rate_window_s


def test_the_trends_window_shrinks_too_when_named():
    cfg = PolicyConfig(
        replica_capacity_rps=10.0,
        protections_fit_at_cold_start_s=FIT_AT_S,
        scaled_with_cold_start=TIME_PROTECTIONS,
    )
    assert cfg.for_cold_start(FIT_AT_S / 2).trend_window_s == pytest.approx(cfg.trend_window_s / 2)


def test_only_time_protections_can_be_scaled():
    with pytest.raises(ValueError, match=r"scaled_with_cold_start=.*queue_tail_share.*must be"):
        PolicyConfig(replica_capacity_rps=10.0, scaled_with_cold_start=("queue_tail_share",))


def test_the_lead_is_the_start_plus_the_scaled_margin():
    cfg = scaling()
    short = cfg.for_cold_start(30.0)
    assert lead_s_for(short, 30.0, None) == pytest.approx(30.0 + cfg.cold_start_margin_s / 4)


def test_the_emergencys_drain_keeps_a_floor_of_a_second():
    assert scaling().for_cold_start(0.0).panic_drain_s == 1.0


def test_the_fit_length_is_range_checked():
    with pytest.raises(ValueError, match="protections_fit_at_cold_start_s"):
        PolicyConfig(replica_capacity_rps=10.0, protections_fit_at_cold_start_s=-1.0)


def test_a_tick_with_a_short_measured_start_plans_over_the_scaled_lead():
    f, learner = Forecaster(), HeadroomLearner()
    seen = step.Observed(5.0, 1, 0, 0, 0, 0.0, cold_start_p95_s=24.0)
    fixed, _, _ = step.tick(f, learner, PolicyState(), PolicyConfig(10.0), seen, 100.0)
    f, learner = Forecaster(), HeadroomLearner()
    scaled, _, _ = step.tick(f, learner, PolicyState(), scaling(), seen, 100.0)
    assert fixed.lead_s == pytest.approx(24.0 + 60.0)
    assert scaled.lead_s == pytest.approx(24.0 + 60.0 * 24.0 / FIT_AT_S)


def test_the_fit_length_comes_from_cluster_yaml_and_is_range_checked():
    app = AppConfig.from_args({"controller": {"protections_fit_at_cold_start_s": 90.0}})
    assert PolicyConfig.from_app_config(app).protections_fit_at_cold_start_s == 90.0
    with pytest.raises(ValueError, match=r"controller.protections_fit_at_cold_start_s=-5"):
        AppConfig.from_args({"controller": {"protections_fit_at_cold_start_s": -5.0}})
