"""The hot/cold policy: forecast-sized cold pool, panic on queue, slow and stable scale-down."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaling.forecast import Forecast
from autoscaling.policy import (
    Decision,
    PolicyConfig,
    PolicyState,
    Snapshot,
    decide,
    effective_capacity_rps,
    in_distress,
    lead_s_for,
    queue_margin_rps,
)
from serving.config import AppConfig

CFG = PolicyConfig(
    replica_capacity_rps=10.0,
    target_utilization=1.0,  # 10 rps per replica keeps the arithmetic readable
    hot_replicas=2,
    min_cold_replicas=0,
    max_cold_replicas=8,
    ttft_slo_s=1.0,
    stabilization_window_s=600.0,
    panic_hold_s=60.0,
    queue_tail_share=0.0,  # no queue margin here: its own tests below
    scale_down_tail_share=0.0,  # nor the scale-down band
)
MARGIN_CFG = PolicyConfig(**{**{k: getattr(CFG, k) for k in CFG.__dataclass_fields__},
                             "queue_tail_share": 0.05})  # fmt: skip


def snap(peak_rps: float, *, cold_ready: int = 0, rate_rps: float = 10.0, **kw) -> Snapshot:
    fc = Forecast(
        rate_at_lead_rps=peak_rps,
        peak_rps=peak_rps,
        basis="test",
        level_rps=rate_rps,
    )
    values = dict(
        hot_replicas=2,
        cold_ready=cold_ready,
        cold_starting=0,
        rate_rps=rate_rps,
        queue_depth=0,
        queue_wait_s=0.0,
        forecast=fc,
    )
    values.update(kw)
    return Snapshot(**values)


def run(snaps_at: list[tuple[float, Snapshot]], cfg: PolicyConfig = CFG) -> list[Decision]:
    state, out = PolicyState.initial(), []
    for now, s in snaps_at:
        d, state = decide(s, state, cfg, now)
        out.append(d)
    return out


def test_cold_target_is_the_forecast_peak_need_minus_hot():
    (d,) = run([(0.0, snap(55.0))])  # 55 rps needs 6 replicas; 2 are hot
    assert (d.hot_target, d.cold_target, d.needed_replicas) == (2, 4, 6)
    assert not d.emergency
    assert d.reason.startswith("cold 0->4: forecast peak 55 rps")


def test_cold_target_is_clamped_between_min_and_max():
    (low,) = run([(0.0, snap(5.0))])
    (high,) = run([(0.0, snap(500.0))])
    assert low.cold_target == 0  # never below min_cold (and hot stays 2)
    assert high.cold_target == CFG.max_cold_replicas


def test_learned_headroom_multiplies_the_forecast():
    (d,) = run([(0.0, snap(40.0, headroom=1.25))])  # 50 rps -> 5 replicas
    (lower,) = run([(0.0, snap(40.0, headroom=0.8))])  # the forecast over-predicts: 32 rps
    assert (d.cold_target, lower.cold_target) == (3, 2)
    assert d.details["headroom"] == 1.25


def test_queue_margin_is_what_poisson_arrivals_need_at_the_emergency_wait():
    # (C - r) C = r ln(1/e) / (2 w), w = 0.5 x 1 s: about ln(20) = 3.0 rps at high rates
    assert queue_margin_rps(0.0, MARGIN_CFG) == 0.0  # no traffic, no margin: scale-to-min holds
    assert queue_margin_rps(100.0, CFG) == 0.0  # queue_tail_share 0: off
    for rate in (1.0, 40.0, 1000.0):
        m = queue_margin_rps(rate, MARGIN_CFG)
        assert m * (rate + m) == pytest.approx(rate * math.log(20.0))
    assert queue_margin_rps(1000.0, MARGIN_CFG) == pytest.approx(math.log(20.0), rel=0.01)
    assert queue_margin_rps(1.0, MARGIN_CFG) < 1.5  # a trickle needs less than a flood


def test_a_right_forecast_still_gets_the_queue_margin():
    # 60 rps fills 6 replicas exactly; a learned headroom of 1.0 would plan them at 100%, where
    # the queue of Poisson arrivals grows without bound. The margin (about 3 rps) asks for a 7th.
    (bare,) = run([(0.0, snap(60.0, headroom=1.0))])
    (d,) = run([(0.0, snap(60.0, headroom=1.0))], MARGIN_CFG)
    assert (bare.needed_replicas, d.needed_replicas) == (6, 7)
    assert "queue margin +2.9 rps" in d.reason
    # a headroom larger than the margin is the plan; the margin is not added on top
    (wide,) = run([(0.0, snap(40.0, headroom=1.25))], MARGIN_CFG)
    assert wide.details["planned_rps"] == pytest.approx(50.0)
    assert "queue margin" not in wide.reason


def test_queue_tail_share_comes_from_cluster_yaml_and_is_range_checked():
    app = AppConfig.from_args({"controller": {"queue_tail_share": 0.01}})
    assert PolicyConfig.from_app_config(app).queue_tail_share == 0.01
    with pytest.raises(ValueError, match=r"controller.queue_tail_share=0.7 is out of range"):
        AppConfig.from_args({"controller": {"queue_tail_share": 0.7}})
    with pytest.raises(ValueError, match=r"PolicyConfig.queue_tail_share=-0.1 is out of range"):
        PolicyConfig(replica_capacity_rps=1.0, queue_tail_share=-0.1)


def test_cluster_yamls_controller_defaults_are_the_policys_defaults_the_replay_was_tuned_with():
    # the replay builds PolicyConfig directly, a live app through cluster.yaml's controller
    # section: both take their defaults from common/policy_defaults.py, so a setting refit on the
    # validation splits moves in both, and the live policy runs what was validated
    live = PolicyConfig.from_app_config(AppConfig.from_args({}))
    replay = PolicyConfig(replica_capacity_rps=live.replica_capacity_rps)
    from_controller_section = (
        "target_utilization",
        "lead_s",
        "cold_start_margin_s",
        "stabilization_window_s",
        "queue_tail_share",
        "scale_down_tail_share",
        "protections_fit_at_cold_start_s",
    )
    for name in from_controller_section:
        assert getattr(live, name) == getattr(replay, name), name


def test_the_plan_takes_the_recent_mean_rate_not_the_last_tick_alone():
    # a 10 s count 30% above its 30 s mean is mostly noise: the base takes the mean
    (d,) = run([(0.0, snap(30.0, rate_rps=52.0, recent_rate_rps=40.0, headroom=1.0))])
    (raw,) = run([(0.0, snap(30.0, rate_rps=52.0, headroom=1.0))])
    assert (d.details["base_rps"], raw.details["base_rps"]) == (40.0, 52.0)


def test_a_rising_trend_above_the_forecast_raises_the_plans_base():
    (plain,) = run([(0.0, snap(40.0, rate_rps=40.0))])
    (rising,) = run([(0.0, snap(40.0, rate_rps=40.0, trend_rps=52.0))])
    (below,) = run([(0.0, snap(40.0, rate_rps=40.0, trend_rps=30.0))])
    assert (plain.needed_replicas, rising.needed_replicas, below.needed_replicas) == (4, 6, 4)
    assert rising.details["base_rps"] == 52.0
    assert "the recent trend 52 rps is above the forecast" in rising.reason
    assert "trend" not in below.reason


def test_adapter_slot_loads_derate_each_replicas_capacity():
    # 10 rps per replica, 20 ms of slot loads per request: 1 / (0.1 + 0.02) = 8.33 rps
    assert effective_capacity_rps(10.0, 0.02) == pytest.approx(1 / 0.12)
    assert effective_capacity_rps(10.0, 0.0) == 10.0
    (plain,) = run([(0.0, snap(55.0))])
    (loaded,) = run([(0.0, snap(55.0, adapter_miss_s_per_request=0.02))])
    assert plain.needed_replicas == 6 and loaded.needed_replicas == 7  # 55 / 8.33 = 6.6
    assert loaded.details["capacity_rps"] == pytest.approx(1 / 0.12)
    assert "adapter slot loads 20 ms/request derate 10" in loaded.reason
    assert "derate" not in plain.reason


def test_adapter_slot_loads_shorten_the_queue_the_emergency_tolerates():
    # 9 waiting on 2 replicas: 0.45 s of capacity at 10 rps each (under half the 1 s SLO),
    # 0.54 s once 20 ms per request go to slot loads (8.33 rps each)
    assert not in_distress(0.0, 9, 2, CFG)
    assert in_distress(0.0, 9, 2, CFG, miss_s_per_request=0.02)
    (calm,) = run([(0.0, snap(10.0, queue_depth=9))])
    (loaded,) = run([(0.0, snap(10.0, queue_depth=9, adapter_miss_s_per_request=0.02))])
    assert not calm.emergency and loaded.emergency


def test_without_learned_headroom_the_r6_safety_factor_applies():
    cfg = PolicyConfig(replica_capacity_rps=10.0, target_utilization=0.8, max_cold_replicas=8)
    d, _ = decide(snap(40.0), PolicyState.initial(), cfg, 0.0)  # 40 / 0.8 = 50 rps
    assert d.needed_replicas == 5 and d.details["headroom"] == 1.25


def test_scale_up_is_immediate_scale_down_waits_a_full_window():
    ds = run(
        [
            (0.0, snap(80.0)),  # 6 cold
            (10.0, snap(30.0, cold_ready=6)),  # wants 1: hold
            (300.0, snap(30.0, cold_ready=6)),  # still inside the window: hold
            (611.0, snap(30.0, cold_ready=6)),  # the 80 rps wish left the window
        ]
    )
    assert [d.cold_target for d in ds] == [6, 6, 6, 1]
    assert "waits for the 600 s window" in ds[1].reason
    assert ds[3].reason.startswith("cold 6->1")


def test_a_brief_dip_inside_the_window_never_releases_replicas():
    ds = run([(0.0, snap(80.0)), (100.0, snap(20.0, cold_ready=6)), (200.0, snap(80.0))])
    assert [d.cold_target for d in ds] == [6, 6, 6]


def test_replicas_still_starting_are_not_cancelled_by_a_dip_in_the_forecast():
    # 4 cold were asked for; 1 is ready and 3 still load when the forecast dips past the window.
    ds = run([(0.0, snap(60.0)), (700.0, snap(30.0, cold_ready=1, cold_starting=3))])
    assert [d.cold_target for d in ds] == [4, 4]
    assert "keeps 3 cold replica(s) that are still starting" in ds[1].reason
    # once they are ready the stabilised scale-down goes ahead
    later = run([(0.0, snap(60.0)), (700.0, snap(30.0, cold_ready=4))])
    assert later[1].cold_target == 1


def test_queue_wait_past_half_the_slo_is_an_emergency_scale_up():
    s = snap(20.0, rate_rps=40.0, queue_depth=200, queue_wait_s=0.6, cold_start_p95_s=60.0)
    (d,) = run([(0.0, s)])
    assert d.emergency
    assert "EMERGENCY queue wait 0.60 s > 0.50 s" in d.reason
    # 40 rps observed + (200 queued + 20 rps shortfall x 60 s cold start) / 30 s drain = 86.7 rps
    assert d.needed_replicas == 9
    assert d.cold_target == 7


def test_queue_depth_alone_triggers_the_emergency():
    # 2 ready replicas serve 20 rps; 15 queued requests are 0.75 s of capacity
    (d,) = run([(0.0, snap(10.0, queue_depth=15, queue_wait_s=0.0))])
    assert d.emergency
    assert "queue depth 15" in d.reason
    assert d.cold_target >= 1  # at least one more replica than now


def test_a_distress_that_lasts_the_cold_start_counts_the_replicas_already_starting():
    # 40 rps against 2 ready replicas (20 rps), 200 queued: 9 replicas, 7 of them cold, at once
    distress = dict(rate_rps=40.0, queue_depth=200, queue_wait_s=0.6, cold_start_p95_s=60.0)
    first, later = run(
        [
            (0.0, snap(20.0, **distress)),
            # ten seconds on, the 7 are still starting and the backlog is the same: nothing more
            (10.0, snap(20.0, cold_starting=7, **distress)),
        ]
    )
    assert first.emergency and first.cold_target == 7
    assert later.emergency and later.cold_target == 7 and later.needed_replicas == 9
    # a backlog that grew while they start asks for what it needs: 40 + (400 + 20 x 60) / 30
    (grown,) = run([(0.0, snap(20.0, cold_starting=7, **{**distress, "queue_depth": 400}))])
    assert grown.needed_replicas == 10 and grown.cold_target == 8


def test_an_emergency_the_observed_rate_does_not_explain_adds_one_replica_over_the_ready():
    # a deep queue at a rate the ready replicas should serve (the capacity figure is too high,
    # or requests grew longer): one more replica than serve now, not zero
    (d,) = run([(0.0, snap(10.0, cold_ready=2, rate_rps=20.0, queue_depth=100, queue_wait_s=0.6))])
    assert d.emergency and d.needed_replicas == 5 and d.cold_target == 3


def test_refusals_past_their_share_trigger_the_emergency_with_a_short_queue():
    # Admission keeps the queue short by refusing (429): 6 of the 40 rps seen were turned away
    # while the 2 ready replicas serve 20, so the refusals, not the queue, show the shortfall.
    s = snap(20.0, rate_rps=40.0, queue_depth=2, queue_wait_s=0.2, refused_rps=6.0)
    (d,) = run([(0.0, s)])
    assert d.emergency
    assert "15% of requests refused for capacity (429)" in d.reason
    # the whole 40 rps observed (refused ones included) + 2 queued drained in 30 s: 5 replicas;
    # the refused shortfall is turned away, not piled up for a cold start as a FIFO queue would
    assert d.needed_replicas == 5
    # one refusal in a hundred is within the share (2%): a blip, not an emergency
    (calm,) = run([(0.0, snap(20.0, rate_rps=40.0, refused_rps=0.4))])
    assert not calm.emergency


def test_refused_share_out_of_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match="panic_refused_share"):
        PolicyConfig(replica_capacity_rps=10.0, panic_refused_share=1.5)


def test_no_scale_down_during_the_panic_hold():
    ds = run(
        [
            (0.0, snap(10.0, queue_depth=100, queue_wait_s=2.0, rate_rps=50.0)),
            (700.0, snap(10.0, cold_ready=4)),  # forecast calm, but the wish to scale down...
        ]
    )
    assert ds[0].emergency and ds[0].cold_target > 0
    assert ds[1].cold_target == 0  # ...is honoured after window and hold have passed
    calm = run(
        [
            (0.0, snap(10.0, queue_depth=100, queue_wait_s=2.0, rate_rps=50.0)),
            (30.0, snap(10.0, cold_ready=ds[0].cold_target)),
        ]
    )
    assert calm[1].cold_target == ds[0].cold_target
    assert "panic hold" in calm[1].reason


def test_lead_is_override_else_measured_cold_start_plus_margin_else_configured():
    assert lead_s_for(CFG, 100.0, 1200.0) == 1200.0
    assert lead_s_for(CFG, 100.0, None) == 100.0 + CFG.cold_start_margin_s
    assert lead_s_for(CFG, None, None) == CFG.lead_s
    (d,) = run([(0.0, snap(30.0, cold_start_p95_s=90.0))])
    assert d.lead_s == 150.0 and f"within 150+{CFG.horizon_s:.0f} s" in d.reason


def test_state_round_trips_through_a_dict():
    _, state = decide(snap(80.0, queue_wait_s=5.0), PolicyState.initial(), CFG, 50.0)
    assert PolicyState.from_dict(state.to_dict()) == state
    assert PolicyState.from_dict(PolicyState.initial().to_dict()) == PolicyState.initial()


def test_from_app_config_maps_pools_slo_and_controller():
    app = AppConfig.from_args(
        {
            "pools": {"hot": {"num_replicas": 3}, "cold": {"max_replicas": 5}},
            "controller": {"replica_capacity_rps": 4.0, "stabilization_window_s": 300},
            "tiers": {"interactive": {"ttft_p99_s": 0.8}},
        }
    )
    cfg = PolicyConfig.from_app_config(app, horizon_s=0.0)
    assert (cfg.hot_replicas, cfg.max_cold_replicas, cfg.replica_capacity_rps) == (3, 5, 4.0)
    assert (cfg.ttft_slo_s, cfg.stabilization_window_s, cfg.horizon_s) == (0.8, 300.0, 0.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"replica_capacity_rps": 0.0}, "PolicyConfig.replica_capacity_rps=0.0 is out of range"),
        ({"hot_replicas": 0}, "PolicyConfig.hot_replicas=0 is out of range"),
        (
            {"min_cold_replicas": 3, "max_cold_replicas": 2},
            "PolicyConfig.min_cold_replicas=3 must be <= PolicyConfig.max_cold_replicas=2",
        ),
        ({"target_utilization": 1.2}, "PolicyConfig.target_utilization=1.2 is out of range"),
        ({"panic_queue_fraction": 0.0}, "PolicyConfig.panic_queue_fraction=0.0 is out of range"),
    ],
)
def test_config_errors_name_field_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**{"replica_capacity_rps": 1.0, **kwargs})


BAND_CFG = replace(MARGIN_CFG, scale_down_tail_share=0.001)  # a band set apart from the default


def test_a_scale_down_must_leave_the_margin_of_the_stricter_band():
    # 62 rps + the 5% margin (2.9 rps) needs 7 replicas: 5 cold. The rate eases to 57: 57 + 2.8
    # fits 6, but 6 would queue past half the SLO 5% of the time, and a replica taken away at
    # a boundary comes back a cold start later. At the band's 0.1% (margin 6.2 rps) 57 needs 7.
    steps = [(0.0, snap(62.0)), (700.0, snap(57.0, cold_ready=5))]
    plain, band = run(steps, MARGIN_CFG), run(steps, BAND_CFG)
    assert [d.cold_target for d in plain] == [5, 4]
    assert [d.cold_target for d in band] == [5, 5]
    assert "keeps 5 cold (4 would queue past half the SLO over 0.001 of the time)" in band[1].reason
    # a clear dip goes down as far as the band allows: 40 rps + 5.6 needs 5 replicas, 3 cold
    (_, dip) = run([(0.0, snap(62.0)), (700.0, snap(40.0, cold_ready=5))], BAND_CFG)
    assert dip.cold_target == 3


def test_the_scale_down_band_never_scales_up():
    # 52 rps + 2.9 needs 6 replicas (4 cold); at 57 the plan still fits 6: the band would ask
    # for 7, but it only holds what is there
    ds = run([(0.0, snap(52.0)), (700.0, snap(57.0, cold_ready=4))], BAND_CFG)
    assert [d.cold_target for d in ds] == [4, 4]
    assert "keeps" not in ds[1].reason


def test_scale_down_tail_share_comes_from_cluster_yaml_and_is_range_checked():
    assert PolicyConfig(replica_capacity_rps=1.0).scale_down_tail_share == 0.01  # the default
    app = AppConfig.from_args({"controller": {"scale_down_tail_share": 0.001}})
    assert PolicyConfig.from_app_config(app).scale_down_tail_share == 0.001
    with pytest.raises(ValueError, match=r"controller.scale_down_tail_share=0.6 is out of range"):
        AppConfig.from_args({"controller": {"scale_down_tail_share": 0.6}})
    with pytest.raises(ValueError, match=r"PolicyConfig.scale_down_tail_share=-1 is out of range"):
        PolicyConfig(replica_capacity_rps=1.0, scale_down_tail_share=-1)


def test_a_band_looser_than_the_plans_margin_keeps_nothing_more():
    loose = replace(MARGIN_CFG, scale_down_tail_share=0.2)
    steps = [(0.0, snap(62.0)), (700.0, snap(57.0, cold_ready=5))]
    assert [d.cold_target for d in run(steps, loose)] == [5, 4]
