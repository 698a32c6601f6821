"""The SLO's feedback on the headroom (adaptive conformal inference on the served traffic)."""

from __future__ import annotations

import math

import pytest

from autoscaling.headroom import HeadroomConfig, HeadroomLearner
from autoscaling.headroom_feedback import SloFeedback
from autoscaling.policy import PolicyConfig, in_distress

WIDE = (math.log(0.1), math.log(10.0))


def run(fb: SloFeedback, start_s: float, ticks: int, distressed, rate=100.0, gain=1e-3):
    for i in range(ticks):
        t = start_s + 10.0 * i
        fb.update(t, rate, distressed(i), target_miss=0.01, gain_per_s=gain, log_range=WIDE)


def test_distress_raises_the_factor_and_calm_lowers_it():
    up, down = SloFeedback(), SloFeedback()
    run(up, 0.0, 100, lambda i: True)
    run(down, 0.0, 100, lambda i: False)
    # 99 steps of 10 s: +gain x 0.99 each when distressed, -gain x 0.01 each when calm
    assert up.theta == pytest.approx(99 * 10 * 1e-3 * 0.99)
    assert down.theta == pytest.approx(-99 * 10 * 1e-3 * 0.01)


def test_the_long_run_distressed_share_settles_at_the_target():
    # a toy system: distressed whenever the factor is below a level the traffic needs (1.3)
    fb = SloFeedback()
    misses = 0
    for i in range(200_000):
        miss = fb.factor < 1.3 if i % 200 else fb.factor < 1.6  # 0.5% of ticks are harder
        misses += miss and i >= 100_000
        fb.update(10.0 * i, 100.0, miss, target_miss=0.01, gain_per_s=1e-3, log_range=WIDE)
    share = misses / 100_000
    assert share == pytest.approx(0.01, abs=0.002)
    assert 1.3 <= fb.factor <= 1.6  # covers the ordinary ticks, lets the rare hard ones through


def test_a_miss_in_busy_traffic_weighs_more_than_one_at_night():
    busy, quiet = SloFeedback(), SloFeedback()
    for fb, rate in ((busy, 300.0), (quiet, 30.0)):
        run(fb, 0.0, 50, lambda i: False)  # the mean rate settles near 100
        fb.mean_rps = 100.0
        before = fb.theta
        fb.update(510.0, rate, True, target_miss=0.01, gain_per_s=1e-3, log_range=WIDE)
        fb.theta -= before
    assert busy.theta == pytest.approx(10 * quiet.theta, rel=0.01)  # the mean moves a little


def test_gaps_learn_nothing_and_the_factor_stays_in_its_range():
    fb = SloFeedback()
    fb.update(0.0, 100.0, True, 0.01, 1e-3, WIDE)
    fb.update(10.0, None, True, 0.01, 1e-3, WIDE)  # a trace gap
    assert fb.theta == 0.0
    for i in range(2, 10_000):
        fb.update(10.0 * i, 100.0, True, 0.01, 1e-3, (math.log(0.5), math.log(2.0)))
    assert fb.factor == pytest.approx(2.0)


def test_the_learner_multiplies_its_conformal_headroom_and_keeps_it_across_a_dict():
    h = HeadroomLearner(HeadroomConfig(quantile=0.9, num_bands=4, min_scores=10))
    for i in range(50):
        h.expect(i * 20.0, i * 20.0 + 10.0, 100.0)
        h.observe(i * 20.0 + 10.0, 120.0)
    assert h.headroom(0.0).factor == pytest.approx(1.2)
    h.feedback.theta = math.log(1.5)
    head = h.headroom(0.0)
    assert head.factor == pytest.approx(1.8) and "x 1.50 SLO feedback" in head.basis
    back = HeadroomLearner.from_dict(h.to_dict())
    assert back.headroom(0.0) == head
    old = h.to_dict()
    del old["feedback"], old["config"]["feedback_gain_per_s"], old["config"]["feedback_range"]
    assert HeadroomLearner.from_dict(old).feedback.theta == 0.0  # a history saved before


def test_the_learner_feedback_follows_the_distress_of_each_tick():
    h = HeadroomLearner(HeadroomConfig(quantile=0.99, feedback_gain_per_s=1e-3))
    for i in range(20):
        h.feedback_on(10.0 * i, 100.0, distressed=True)
    assert h.feedback.factor > 1.1


def test_distress_is_the_emergency_test():
    cfg = PolicyConfig(replica_capacity_rps=10.0, ttft_slo_s=1.0, panic_queue_fraction=0.5)
    assert not in_distress(0.4, 10, 4, cfg)  # 10 queued = 0.25 s of 40 rps
    assert in_distress(0.6, 0, 4, cfg)  # the wait
    assert in_distress(0.0, 30, 4, cfg)  # the depth: 0.75 s of capacity


@pytest.mark.parametrize(
    ("kw", "allowed"),
    [
        ({"feedback_gain_per_s": -1.0}, "0.0 <= feedback_gain_per_s"),
        ({"feedback_range": (1.2, 2.0)}, "feedback_range[0]"),
        ({"feedback_range": (0.5, 0.9)}, "feedback_range[1]"),
    ],
)
def test_bad_feedback_settings_name_the_field(kw, allowed):
    with pytest.raises(ValueError, match=re_escape(allowed)):
        HeadroomConfig(**kw)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
