"""The replay's reactive and Knative baselines (autoscaling/replay/baselines.py): the denominators
of the autoscaling targets, so their rules are pinned here. Capacity 1 req/s per replica at
utilisation 1 and a 1 s mean end-to-end, so a replica is wanted per req/s of load (rate + queue /
e2e). Ticks every 10 s; time is passed in."""

from __future__ import annotations

import math

import pytest

from autoscaling.replay.baselines import (
    KnativeController,
    ReactiveController,
    StaticController,
    replicas_for,
)
from autoscaling.replay.sim import Observation


def obs(rate: float | None, queue: float = 0.0, ready: int = 1) -> Observation:
    """One hot replica plus `ready - 1` cold ones serving."""
    return Observation(rate_rps=rate, queue_depth=queue, queue_wait_s=0.0, hot_ready=1,
                       cold_ready=ready - 1, cold_starting=0)  # fmt: skip


def reactive(**kw) -> ReactiveController:
    return ReactiveController("reactive", 1.0, 1.0, 1.0, hot_replicas=1, **kw)


def knative(**kw) -> KnativeController:
    return KnativeController("knative", 1.0, 1.0, 1.0, **kw)


def play(ctl, rates: list[float | None], t0: float = 0.0, queue: float = 0.0) -> list[int]:
    """Cold targets, one per 10 s tick (every replica asked for is ready: no cold start)."""
    out, ready = [], 1
    for i, rate in enumerate(rates):
        targets = ctl.tick(t0 + 10.0 * i, obs(rate, queue, ready))
        out.append(targets.cold)
        ready = 1 + targets.cold
    return out


def test_replicas_for_rounds_up_to_the_utilisation_target():
    assert replicas_for(10.0, 2.0, 1.0) == 5
    assert replicas_for(10.0, 2.0, 0.8) == 7  # 6.25 replicas at 80%
    assert replicas_for(0.0, 2.0, 0.8) == 0


# ----- reactive: Ray Serve's default policy ---------------------------------------------------


def test_reactive_starts_at_the_traces_level():
    assert play(reactive(), [5.0]) == [4]  # 5 replicas: 1 hot + 4 cold


def test_reactive_scales_up_only_after_the_wish_lasted_30_s():
    # a step 2 -> 10 req/s at t = 30: the 30 s look-back averages it in, the wish starts at 30
    targets = play(reactive(), [2.0] * 3 + [10.0] * 5)
    assert targets[:6] == [1, 1, 1, 1, 1, 1]  # t = 30, 40, 50: the wish is younger than 30 s
    assert targets[6] == 9  # t = 60: 30 s after the wish began, to the window's desire (10)


def test_reactive_scales_down_only_after_600_s():
    targets = play(reactive(), [10.0] + [2.0] * 70)
    assert set(targets[1:61]) == {9}  # t = 10 .. 600: the downscale wish is younger than 600 s
    assert targets[61] == 1  # t = 610: 600 s after the wish began at t = 10


def test_reactive_a_wish_that_changes_direction_restarts_its_delay():
    # down for 300 s, then back up above the level: the downscale never happens, and the
    # upscale waits its own 30 s from when it began (t = 320, once the 30 s look-back's mean
    # of 2, 8, 8 wants more than the 5 replicas held)
    targets = play(reactive(), [5.0] + [2.0] * 30 + [8.0] * 6)
    assert set(targets[:35]) == {4}
    assert targets[35] == 7  # t = 350


def test_reactive_counts_the_queue_as_load_and_holds_the_last_rate_through_a_gap():
    # 3 req/s with 20 queued at e2e 1 s: 23 replicas' worth of load, capped at max 12
    assert play(reactive(max_replicas=12), [3.0], queue=20.0) == [11]
    targets = play(reactive(), [6.0, None, None, None, None])
    assert targets == [5] * 5  # a gap is not zero traffic


def test_reactive_keeps_one_replica_even_at_zero_traffic():
    assert play(reactive(), [0.0]) == [0]  # the hot replica; no cold one


# ----- Knative's KPA: stable and panic windows ------------------------------------------------


def test_knative_follows_the_60_s_stable_window_mean():
    targets = play(knative(), [4.0] * 6 + [6.0] * 6)
    assert targets[0] == 3  # starts at the trace's level: 4 replicas, one of them hot
    # t = 60: the 60 s window holds 4,4,4,4,4,6 (t = 10..60): mean 4.33 -> 5 replicas
    assert targets[6] == 4
    assert targets[11] == 5  # once the window holds only 6 req/s: 6 replicas


def test_knative_panics_when_the_6_s_desire_doubles_the_ready_replicas_and_never_scales_down():
    ctl = knative()
    assert ctl.tick(0.0, obs(4.0, ready=4)).emergency is False
    # 9 req/s on 4 ready replicas: the panic window (the last tick) wants 9 >= 2 x 4
    jump = ctl.tick(10.0, obs(9.0, ready=4))
    assert jump.emergency and jump.cold == 8  # to the panic desire at once, not the stable 6.5
    # the load falls back at once: in panic it holds 9 for 60 s after the last panic
    held = [ctl.tick(10.0 + 10.0 * i, obs(1.0, ready=9)) for i in range(1, 7)]
    assert [t.cold for t in held[:5]] == [8] * 5 and all(t.emergency for t in held[:5])
    assert held[5].emergency is False  # t = 70: 60 s after the panic began at t = 10


def test_knative_just_under_twice_the_ready_replicas_is_no_panic():
    ctl = knative()
    ctl.tick(0.0, obs(4.0, ready=4))
    t = ctl.tick(10.0, obs(7.9, ready=4))  # wants 8 = 2 x 4: a panic
    assert t.emergency
    ctl = knative()
    ctl.tick(0.0, obs(4.0, ready=4))
    t = ctl.tick(10.0, obs(6.9, ready=4))  # wants 7 < 8: no panic, the stable mean (5.45 -> 6)
    assert not t.emergency and t.cold == 5


def test_knative_scales_down_at_most_by_half_per_tick():
    ctl = knative()
    ctl.tick(0.0, obs(16.0, ready=16))
    totals = [1 + ctl.tick(10.0 * i, obs(1.0, ready=16)).cold for i in range(1, 8)]
    # the stable window needs 7 ticks to forget 16 req/s; each tick keeps at least half
    assert all(b >= math.ceil(a / 2) for a, b in zip([16, *totals], totals, strict=False))
    assert totals[-1] == 1


def test_knative_respects_its_maximum():
    assert play(knative(max_replicas=5), [40.0]) == [4]


def test_static_holds_its_replicas_as_hot_and_asks_for_no_cold_one():
    ctl = StaticController("static_peak", 7)
    assert ctl.hot_replicas == 7 and ctl.tick(0.0, obs(100.0)).cold == 0


@pytest.mark.parametrize("delay", [0.0, 30.0])
def test_reactive_upscale_delay_is_a_setting(delay):
    targets = play(reactive(upscale_delay_s=delay, look_back_s=1.0), [1.0, 5.0, 5.0, 5.0, 5.0])
    assert targets[1 + int(delay // 10)] == 4
    assert all(t == 0 for t in targets[: 1 + int(delay // 10)])
