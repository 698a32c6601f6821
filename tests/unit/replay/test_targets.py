"""T1-T3 from sweeps (autoscaling/replay/targets.py), on hand-made frontiers; and the replay's
interpolated, phase-shifted arrivals keep the trace's traffic (autoscaling/replay/runner.py)."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.policy import PolicyConfig
from autoscaling.replay.frontier import gpu_hours_to_reach
from autoscaling.replay.runner import ReplaySettings, prepare
from autoscaling.replay.targets import (
    across_seeds,
    references_judged_as_policies,
    seed_targets,
    t3a_ceiling,
)
from autoscaling.replay.traces import RateTrace


def row(value, gpu_hours, slo, minutes):
    return {"value": value, "gpu_hours": gpu_hours, "slo_attainment": slo,
            "violation_minutes": sum(minutes),
            "per_day": {"violation_minutes": minutes}}  # fmt: skip


def sweeps(ts_minutes=(1.0, 1.0, 1.0)):
    return {
        "tideserve": [row(0.99, 105.0, 0.990, [5, 5, 5]), row(0.995, 110.0, 0.996, ts_minutes)],
        "reactive": [row(0.8, 100.0, 0.98, [20, 22, 18]), row(0.7, 140.0, 0.997, [4, 3, 5])],
        "knative": [row(0.8, 100.0, 0.99, [9, 8, 10]), row(0.7, 130.0, 0.996, [2, 2, 2])],
        "oracle": [row(0.0, 100.0, 1.0, [0, 0, 0])],
    }


def test_one_seeds_targets():
    t = seed_targets(sweeps(), 0.995, gpu_hours_to_reach)
    assert t["t1"]  # 99.6% at 1.10x the oracle
    # to 99.5%, between the sweep points: tideserve 109.2, knative 125, reactive 135.3
    reach = 105 + 5 * 5 / 6
    assert t["gpu_hours_to_99_5_over_oracle"]["tideserve"] == pytest.approx(reach / 100)
    assert t["t2"] and t["t3b"]  # 109.2 <= 0.9 x 125
    assert t["t3b_saving_over_best_baseline"] == pytest.approx(1 - reach / 125)
    # reactive at 110 GPU-h, a quarter of the way from 100 to 140: 16 + 17.25 + 14.75
    assert t["violation_minutes_at_tideserve_gpu_hours"]["reactive"] == pytest.approx(48.0)


def test_t1_fails_on_cost_and_t3b_on_a_small_saving():
    s = sweeps()
    s["tideserve"][1]["gpu_hours"] = 120.0  # 1.2x the oracle
    s["knative"][1]["gpu_hours"] = 112.0  # reaches 99.5% at about 110
    t = seed_targets(s, 0.995, gpu_hours_to_reach)
    assert not t["t1"] and not t["t2"] and not t["t3b"]


def test_t3a_needs_the_per_day_interval_above_zero_against_every_baseline():
    seeds = [sweeps(), sweeps()]
    per = [seed_targets(s, 0.995, gpu_hours_to_reach) for s in seeds]
    got = across_seeds(seeds, 0.995, per)
    assert got["t3a_per_day_difference"]["reactive"]["interval_above_zero"]
    assert got["targets"]["t3a_every_baseline"] and got["targets"]["t1_every_seed"]
    # one day where tideserve is worse than knative: the interval straddles 0
    worse = [sweeps((1.0, 30.0, 1.0)), sweeps((1.0, 30.0, 1.0))]
    per = [seed_targets(s, 0.995, gpu_hours_to_reach) for s in worse]
    got = across_seeds(worse, 0.995, per)
    assert not got["t3a_per_day_difference"]["knative"]["interval_above_zero"]
    assert not got["targets"]["t3a_every_baseline"]


def test_a_reference_is_judged_by_the_same_targets_as_the_policy():
    # next_window told the future: at 110 GPU-h it has 1 violation-minute a day where knative
    # (interpolated) has 6: T3a met; to 99.5% it needs 101 GPU-h against knative's 125: T3b met
    told = [row(1.1, 110.0, 0.999, [1, 1, 1]), row(1.0, 100.0, 0.994, [7, 6, 8])]
    # present_rate, told less: more violations than knative at its cost on one day of three
    late = [row(1.2, 110.0, 0.996, [1, 30, 1])]
    seeds = [sweeps() | {"next_window": told, "present_rate": late} for _ in range(2)]
    got = references_judged_as_policies(seeds, gpu_hours_to_reach)
    nw = got["next_window"]
    assert nw["points"][0]["meets_t3a"] and nw["meets_t3a_at_some_point"]
    # knative at 110 GPU-h, a third of the way from 100 to 130: 20/3, 18/3 and 22/3 a day
    assert nw["points"][0]["t3a"]["knative"]["mean"] == pytest.approx((20 + 18 + 22) / 9 - 1)
    # reaching 99.5% at 100 + 10 x (0.995 - 0.994) / (0.999 - 0.994) = 102 GPU-h
    assert nw["t3b_saving_by_seed"] == pytest.approx([1 - 102 / 125] * 2)
    assert nw["meets_t3b_every_seed"]
    pr = got["present_rate"]
    assert not pr["meets_t3a_at_some_point"]
    assert pr["points"][0]["gpu_hours_over_oracle_mean"] == pytest.approx(1.1)
    assert "rate_oracle" not in got  # not swept: not judged


def test_no_policy_meets_t3a_against_a_baseline_with_a_day_it_misses_nothing_at_every_cost():
    seeds = [sweeps(), sweeps()]
    got = t3a_ceiling(seeds)
    # every day has violations at every point of every baseline: a policy with none could pass
    assert got["possible"]
    assert got["by_baseline"]["knative"]["points"][0]["mean_ci95"]["mean"] == pytest.approx(9.0)
    # knative misses nothing on day 2 at any cost and a lot on day 1: the interval of its own
    # minutes, the most any policy can be ahead of it by, reaches below 0 at both points
    for sw in seeds:
        sw["knative"] = [row(0.8, 100.0, 0.99, [40, 0, 1]), row(0.7, 130.0, 0.996, [9, 0, 1])]
    got = t3a_ceiling(seeds)
    assert not got["by_baseline"]["knative"]["above_zero_at_some_cost"]
    assert got["by_baseline"]["reactive"]["above_zero_at_some_cost"]
    assert not got["possible"]
    assert got["by_baseline"]["knative"]["points"][1]["per_day_violation_minutes"] == [9, 0, 1]
    # a policy with no violation, cheaper than knative's cheapest point, scores exactly that
    for sw in seeds:
        sw["tideserve"][1] = row(0.995, 95.0, 1.0, [0, 0, 0])
    per = [seed_targets(sw, 0.995, gpu_hours_to_reach) for sw in seeds]
    t3a = across_seeds(seeds, 0.995, per)["t3a_per_day_difference"]["knative"]["mean_ci95"]
    assert t3a == got["by_baseline"]["knative"]["points"][0]["mean_ci95"]


def test_between_two_points_the_interpolated_baseline_can_leave_a_policy_room():
    # each point misses on three or four days only, but not the same days: halfway between,
    # the baseline misses on six of seven, evenly enough for a perfect policy's interval to clear 0
    early, late = [30, 30, 30, 0, 0, 0, 0], [0, 0, 0, 30, 30, 30, 0]
    seeds = [
        {
            "knative": [row(0.8, 100.0, 0.99, early), row(0.7, 130.0, 0.99, late)],
            "oracle": [row(0.0, 100.0, 1.0, [0] * 7)],
        }
        for _ in range(2)
    ]
    got = t3a_ceiling(seeds)["by_baseline"]["knative"]
    assert not any(p["interval_above_zero"] for p in got["points"])
    assert got["highest_lower_bound_between_points"] > 0 and got["above_zero_at_some_cost"]


def test_interpolated_phase_shifted_arrivals_keep_the_traces_traffic():
    hours = np.arange(3 * 144) / 6.0
    means = 100.0 + 40.0 * np.sin(hours / 4)
    trace = RateTrace("three-days", "rate_series", 600.0, 0.0, means)
    cfg = PolicyConfig(replica_capacity_rps=20.0)
    base = ReplaySettings(train_days=1.0)
    held = prepare(trace, cfg, base)
    smooth = prepare(trace, cfg, ReplaySettings(train_days=1.0, arrival_shape="interpolated"))
    later = prepare(
        trace, cfg, ReplaySettings(train_days=1.0, arrival_shape="interpolated", phase_s=137)
    )
    # the same traffic, to Poisson noise (2 days x ~100 rps)
    assert smooth.arrivals.sum() == pytest.approx(held.arrivals.sum(), rel=2e-3)
    assert later.arrivals.sum() == pytest.approx(held.arrivals.sum(), rel=2e-3)
    assert held.train_rates.tolist() == means[:144].tolist()  # steps: the trace's windows
    assert smooth.train_rates == pytest.approx(means[:144], rel=1e-9)
    assert not np.allclose(later.train_rates, means[:144])  # shifted: the windows moved
    with pytest.raises(ValueError, match="arrival_shape='spline'"):
        ReplaySettings(arrival_shape="spline")
