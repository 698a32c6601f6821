"""The R7 online tuner: start 8 / 50 ms, double while p99 holds, step back on a marked rise,
hold in the 50-70% busy band. Pure: observations and `now` are built by hand."""

from __future__ import annotations

import pytest

from serving.embed.tuner import (
    DOUBLE,
    HOLD,
    STEP_BACK,
    Observation,
    TunerConfig,
    TunerState,
    decide,
    initial_state,
)

CFG = TunerConfig(p99_target_s=0.2)


def obs(p99_s=0.05, busy=0.3, n=100) -> Observation:
    return Observation(p99_s, busy, n)


def test_starts_at_batch_8_and_window_50ms():
    assert initial_state(CFG) == TunerState(size=8, window_s=0.05)


def test_doubles_while_p99_within_target_up_to_max():
    state, sizes = initial_state(CFG), []
    for i in range(5):
        decision, state = decide(obs(), state, CFG, now=10.0 * i)
        sizes.append(decision.size)
    assert sizes == [16, 32, 64, 64, 64]
    assert decision.action == HOLD and "would pass 64" in decision.reason


def test_marked_rise_steps_back_one_size_and_cuts_window_10ms():
    state = TunerState(size=32, window_s=0.05, baseline_p99_s=0.05)
    decision, state = decide(obs(p99_s=0.25), state, CFG, now=0.0)
    assert (decision.action, decision.size, decision.window_s) == (STEP_BACK, 16, 0.04)
    assert "p99 250.0 ms > target 200.0 ms" in decision.reason
    assert "size 32 -> 16, window 50 -> 40 ms" in decision.reason


def test_a_jump_over_the_pre_doubling_p99_counts_as_marked_even_within_target():
    state = TunerState(size=16, window_s=0.05, baseline_p99_s=0.07)
    decision, _ = decide(obs(p99_s=0.12), state, CFG, now=0.0)  # 0.12 > 1.5 x 0.07, > 0.1
    assert decision.action == STEP_BACK and "1.5 x 70.0 ms" in decision.reason


def test_a_jump_far_below_target_is_noise():
    state = TunerState(size=16, window_s=0.05, baseline_p99_s=0.001)
    decision, _ = decide(obs(p99_s=0.004), state, CFG, now=0.0)  # 4x, but 4 ms of 200
    assert decision.action == DOUBLE


def test_failed_size_becomes_a_ceiling_until_its_ttl():
    state = TunerState(size=32, window_s=0.05)
    _, state = decide(obs(p99_s=0.3), state, CFG, now=0.0)
    decision, state = decide(obs(), state, CFG, now=10.0)
    assert decision.action == HOLD and "would pass 32" in decision.reason
    decision, _ = decide(obs(), state, CFG, now=CFG.ceiling_ttl_s + 1)
    assert (decision.action, decision.size) == (DOUBLE, 32)


def test_holds_in_the_healthy_band():
    for busy in (0.5, 0.6, 0.7):
        decision, state = decide(obs(busy=busy), initial_state(CFG), CFG, now=0.0)
        assert decision.action == HOLD and "healthy" in decision.reason
        assert state == initial_state(CFG)


def test_over_target_wins_over_the_band():
    decision, _ = decide(obs(p99_s=0.5, busy=0.6), initial_state(CFG), CFG, now=0.0)
    assert decision.action == STEP_BACK


def test_too_few_samples_decide_nothing():
    decision, state = decide(obs(p99_s=9.0, n=3), initial_state(CFG), CFG, now=0.0)
    assert decision.action == HOLD and "3 samples" in decision.reason
    assert state == initial_state(CFG)


def test_floor_holds_and_window_never_negative():
    state = TunerState(size=1, window_s=0.005)
    decision, state = decide(obs(p99_s=1.0), state, CFG, now=0.0)
    assert (decision.action, decision.size, decision.window_s) == (STEP_BACK, 1, 0.0)
    decision, _ = decide(obs(p99_s=1.0), state, CFG, now=1.0)
    assert decision.action == HOLD and "already at min size and window" in decision.reason


def test_drives_an_llm_concurrency_ceiling_without_a_window():
    cfg = TunerConfig(
        p99_target_s=2.0, start_size=16, max_size=64, start_window_s=0.0, window_step_s=0.0
    )
    decision, state = decide(obs(p99_s=1.0), initial_state(cfg), cfg, now=0.0)
    assert (decision.size, decision.window_s) == (32, 0.0)
    decision, state = decide(obs(p99_s=3.0), state, cfg, now=1.0)
    assert (decision.action, decision.size, decision.window_s) == (STEP_BACK, 16, 0.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"p99_target_s": 0}, "tuner.p99_target_s=0 is out of range"),
        ({"start_size": 128}, "tuner.start_size=128 must be <= tuner.max_size=64"),
        ({"rise_factor": 1.0}, "tuner.rise_factor=1.0 is out of range"),
        ({"busy_low": 0.8}, "tuner.busy_low=0.8 must be <= tuner.busy_high=0.7"),
    ],
)
def test_config_errors_name_field_value_and_range(overrides, message):
    with pytest.raises(ValueError, match=message):
        TunerConfig(**{"p99_target_s": 0.2, **overrides})


def test_every_change_is_a_metric_and_the_knobs_are_gauges():
    from serving.embed.metrics import BATCH_TARGET_SIZE, BATCH_WINDOW, TUNER_CHANGES, BatchMetrics
    from serving.embed.tuner import TunerDecision

    class Recorder:
        def __init__(self, name):
            self.name, self.calls = name, []

        def set(self, value, tags=None):
            self.calls.append(("set", value, tags))

        def inc(self, value, tags=None):
            self.calls.append(("inc", value, tags))

        def observe(self, value, tags=None):
            self.calls.append(("observe", value, tags))

    made = {}

    def factory(kind, name, description, tag_keys, boundaries):
        made[name] = Recorder(name)
        return made[name]

    metrics = BatchMetrics(factory=factory)
    metrics.tuned(TunerDecision(HOLD, 8, 0.05, "healthy"))
    metrics.tuned(TunerDecision(STEP_BACK, 4, 0.04, "p99 over target"))
    assert made[TUNER_CHANGES].calls == [("inc", 1.0, {"action": "step_back"})]
    assert made[BATCH_TARGET_SIZE].calls[-1] == ("set", 4.0, None)
    assert made[BATCH_WINDOW].calls[-1] == ("set", 0.04, None)
