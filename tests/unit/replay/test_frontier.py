"""Reading the cost/SLO frontier: GPU-hours to reach an SLO, violations at equal GPU-hours."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.policy import PolicyConfig
from autoscaling.replay.frontier import (
    Sweep,
    default_sweeps,
    gpu_hours_to_reach,
    run_sweeps,
    violations_at,
)
from autoscaling.replay.runner import ReplaySettings, prepare
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.traces import RateTrace


def row(gpu_hours: float, slo: float, violations: float = 0.0) -> dict:
    return {"gpu_hours": gpu_hours, "slo_attainment": slo, "num_slo_violations": violations}


def test_gpu_hours_to_reach_interpolates_between_the_points_around_the_slo():
    rows = [row(100, 0.990), row(120, 0.996), row(200, 0.9999)]
    # 0.995 lies 5/6 of the way from 0.990 to 0.996
    assert gpu_hours_to_reach(rows, 0.995) == pytest.approx(100 + 20 * 5 / 6)
    assert gpu_hours_to_reach(rows, 0.999) == pytest.approx(120 + 80 * 3 / 3.9)


def test_a_point_that_already_reaches_it_is_the_answer_and_none_when_never_reached():
    assert gpu_hours_to_reach([row(100, 0.999), row(150, 1.0)], 0.995) == 100
    assert gpu_hours_to_reach([row(100, 0.99), row(150, 0.994)], 0.995) is None


def test_a_costlier_point_that_does_worse_does_not_bend_the_frontier():
    rows = [row(100, 0.990), row(110, 0.980), row(120, 0.996)]
    assert gpu_hours_to_reach(rows, 0.995) == pytest.approx(100 + 20 * 5 / 6)


def test_violations_at_equal_gpu_hours_are_log_interpolated():
    rows = [row(100, 0.99, 10_000), row(200, 0.999, 100)]
    assert violations_at(rows, 150) == pytest.approx(1000)
    assert violations_at(rows, 100) == pytest.approx(10_000)
    assert violations_at(rows, 99) is None and violations_at(rows, 201) is None


def test_every_policy_sweeps_one_knob_and_reactive_includes_rays_default():
    sweeps = {s.policy: s for s in default_sweeps(ServiceModel(20.0, mean_e2e_s=10.0), "full")}
    assert set(sweeps) == {"reactive", "knative", "rule_70_30", "tideserve", "oracle",
                           "present_rate", "next_window", "rate_oracle"}  # fmt: skip
    reactive = sweeps["reactive"]
    assert reactive.knob == "target_ongoing_requests" and 2.0 in reactive.values
    assert "Ray default" in reactive.labels[2.0]
    # 200 requests in flight per replica at capacity: 85% is 170
    assert 170.0 in reactive.values and 0.7 in sweeps["rule_70_30"].values


def test_the_per_seed_sweep_spans_the_targets_costs_with_fewer_points():
    svc = ServiceModel(20.0, mean_e2e_s=10.0)
    seeds = {s.policy: s for s in default_sweeps(svc, "seeds")}
    full = {s.policy: s for s in default_sweeps(svc, "full")}
    assert set(seeds) == set(full)
    assert 0.995 in seeds["tideserve"].values  # the default is always swept
    # points on both sides of each 99.5% crossing, close together: tideserve's between q 0.99
    # and 0.995, Knative's between utilisation 0.85 and 0.9 (200 in flight at capacity)
    assert {0.99, 0.993} <= set(seeds["tideserve"].values)
    assert {170.0, 175.0, 180.0} <= set(seeds["knative"].values)
    assert 2.0 not in seeds["reactive"].values  # Ray's default costs 5x: off every target
    # the 70/30 rule reaches below tideserve's cost (T3a compares at equal GPU-hours) and keeps R6
    assert min(seeds["rule_70_30"].values) <= 0.2 and 0.7 in seeds["rule_70_30"].values
    assert sum(len(s.values) for s in seeds.values()) < sum(len(s.values) for s in full.values())
    with pytest.raises(ValueError, match="sweep level='most'"):
        default_sweeps(svc, "most")


def test_sweeps_in_parallel_give_the_same_rows_in_the_same_order():
    hours = np.arange(2 * 144) / 6.0
    trace = RateTrace("two-days", "rate_series", 600.0, 0.0, 100.0 + 40.0 * np.sin(hours / 4))
    cfg = PolicyConfig(replica_capacity_rps=20.0)
    svc = ServiceModel(20.0)
    s = ReplaySettings(train_days=1.0)
    prep = prepare(trace, cfg, s)
    sweeps = (
        Sweep("reactive", "target_ongoing_requests", (120.0, 170.0)),
        Sweep("oracle", "none", (0.0,)),
    )
    one = run_sweeps(prep, cfg, svc, s, sweeps)
    two = run_sweeps(prep, cfg, svc, s, sweeps, jobs=2)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in rows]  # noqa: E731
    assert {p: strip(r) for p, r in one.items()} == {p: strip(r) for p, r in two.items()}
    assert [r["value"] for r in one["reactive"]] == [120.0, 170.0]
