"""Measured cold starts in the replay (autoscaling/replay/cold_starts.py): each start draws its
own length, the simulator keeps the starting replicas in the order they come up, and the
controllers plan on what they could know."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoscaling.replay.cold_starts import ColdStarts
from autoscaling.replay.runner import ReplaySettings
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.sim import Observation, Targets, simulate

SVC = ServiceModel(10.0, ttft_idle_s=0.2, ttft_full_s=0.4)
MEASURED = (52.4, 18.3, 19.4, 18.3)  # a node's first start, then three with the cache present


class Scripted:
    """Asks for the cold targets of `plan` ({time: target}), holding each until the next."""

    name, hot_replicas = "scripted", 1

    def __init__(self, plan: dict[int, int]) -> None:
        self.plan, self.cold = plan, 0

    def tick(self, now_s: float, obs: Observation) -> Targets:
        self.cold = self.plan.get(int(now_s), self.cold)
        return Targets(self.cold)


def test_percentiles_are_nearest_rank_like_the_live_controllers():
    starts = ColdStarts(MEASURED)
    assert starts.median_s == 18.3  # a start that happened, never an interpolation
    assert starts.p95_s == 52.4 and starts.max_s == 52.4  # 4 samples: p95 is the longest
    assert not starts.is_constant and ColdStarts.constant(120.0).is_constant


@pytest.mark.parametrize("samples", [(), (10.0, -1.0), (float("nan"),), (0.0,)])
def test_no_cold_start_that_could_not_happen_is_accepted(samples):
    with pytest.raises(ValueError, match="samples_s"):
        ColdStarts(samples)


def test_draws_come_from_the_samples_and_repeat_with_the_seed():
    starts = ColdStarts(MEASURED)
    first = starts.sampler(3)(200)
    assert set(first) <= set(MEASURED)
    assert first == starts.sampler(3)(200)  # every policy of a replay meets the same starts
    assert first != starts.sampler(4)(200)
    assert 0.1 < first.count(52.4) / 200 < 0.4  # uniform over the 4 samples
    assert ColdStarts.constant(120.0).sampler(0)(3) == [120.0, 120.0, 120.0]
    assert starts.sampler(0)(0) == []


def test_the_result_file_of_the_cold_start_benchmark_is_read_as_measured(tmp_path):
    path = tmp_path / "cold_start.json"
    trials = [{"trial": i, "deploy_to_ready_s": s} for i, s in enumerate(MEASURED)]
    path.write_text(json.dumps({"machine": {"cpu": "AMD EPYC"}, "trials": trials}))
    starts = ColdStarts.from_cold_start_result(path)
    assert starts.samples_s == MEASURED
    assert "4 starts measured on AMD EPYC" in starts.source
    path.write_text(json.dumps({"trials": []}))
    with pytest.raises(ValueError, match="no 'trials' list"):
        ColdStarts.from_cold_start_result(path)
    path.write_text(json.dumps({"trials": [{"trial": 0}]}))
    with pytest.raises(ValueError, match="deploy_to_ready_s"):
        ColdStarts.from_cold_start_result(path)


def test_a_cold_starts_flag_reads_its_file_or_leaves_every_start_the_constant(tmp_path):
    path = tmp_path / "cold_start.json"
    trials = [{"trial": i, "deploy_to_ready_s": s} for i, s in enumerate(MEASURED)]
    path.write_text(json.dumps({"trials": trials}))
    assert ColdStarts.load(path, 120.0).samples_s == MEASURED
    unset = ColdStarts.load(None, 90.0)
    assert unset.is_constant and unset.median_s == unset.p95_s == 90.0


def test_each_start_comes_up_after_its_own_draw():
    arrivals = np.full(300, 5.0)
    draws = iter([90.0, 30.0])
    res = simulate(
        Scripted({100: 2}), arrivals, arrivals, 0.0, SVC, 10, cold_start_s=60.0,
        draw_cold_starts=lambda n: [next(draws) for _ in range(n)],
    )  # fmt: skip
    assert res.replicas[100] == 3  # both hold a GPU from the ask
    assert res.ready[129] == 1 and res.ready[130] == 2  # the 30 s draw first
    assert res.ready[189] == 2 and res.ready[190] == 3


def test_scale_down_cancels_the_start_due_last():
    arrivals = np.full(300, 5.0)
    draws = iter([30.0, 90.0])
    res = simulate(
        Scripted({100: 2, 110: 1}), arrivals, arrivals, 0.0, SVC, 10, cold_start_s=60.0,
        draw_cold_starts=lambda n: [next(draws) for _ in range(n)],
    )  # fmt: skip
    assert res.replicas[110] == 2  # one start cancelled at 110
    assert res.ready[130] == 2  # the one due at 130 was kept
    assert res.ready[299] == 2


def test_measured_starts_need_the_reported_cold_start_to_be_their_median():
    starts = ColdStarts(MEASURED)
    s = ReplaySettings(cold_start_s=starts.median_s, cold_starts=starts)
    assert s.starts is starts
    assert ReplaySettings(cold_start_s=90.0).starts == ColdStarts.constant(90.0)
    with pytest.raises(ValueError, match=r"cold_start_s=120.0 disagrees with cold_starts"):
        ReplaySettings(cold_starts=starts)
