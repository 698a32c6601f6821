"""The LLM concurrency tuner: the pure decision (serving/engine/tuner.py) on constructed
intervals, and the loop (window + EngineTuner) on a real tiny engine with a fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.tuner import (
    HOLD,
    RAISE,
    SCALE_OUT,
    SHRINK,
    Observation,
    TunerConfig,
    TunerState,
    decide,
    initial_state,
)
from serving.engine.tuning import EngineTuner, TierSlo, observation
from serving.engine.window import StepWindow, fit_line
from serving.tiny_models import tiny_model

CFG = TunerConfig()
HEALTHY = Observation(
    num_samples=50,
    num_gaps=500,
    ttft_ratio=0.3,
    itl_ratio=0.3,
    queue_ratio=0.05,
    tokens_per_busy_s=400.0,
    arrivals_per_s=5.0,
    busy_fraction=0.6,
    ceiling_bound=0.0,
    budget_bound=0.0,
    prefill_fraction=0.3,
    kv_admissible_seqs=200,
)


def obs(**kw) -> Observation:
    return dataclasses.replace(HEALTHY, **kw)


def state(seqs=32, tokens=512, **kw) -> TunerState:
    return dataclasses.replace(TunerState(seqs, tokens), **kw)


def test_healthy_and_nothing_binds_holds():
    move, new = decide(HEALTHY, state(), CFG, 100.0)
    assert move.action == HOLD and "no knob binds" in move.reason
    assert new == state()


def test_raises_the_ceiling_while_p99_holds_and_it_binds():
    move, new = decide(obs(ceiling_bound=0.6), state(), CFG, 100.0)
    assert move.action == RAISE and move.knob == "max_num_seqs"
    assert (new.max_num_seqs, new.max_batched_tokens) == (64, 512)
    assert new.raised == "max_num_seqs" and new.efficiency_before_raise == 400.0
    assert "max_num_seqs 32 -> 64" in move.reason


def test_never_raises_above_what_the_kv_budget_admits():
    move, new = decide(obs(ceiling_bound=0.6, kv_admissible_seqs=40), state(), CFG, 100.0)
    assert move.action == RAISE and new.max_num_seqs == 40
    move, _ = decide(obs(ceiling_bound=0.6, kv_admissible_seqs=40), new, CFG, 105.0)
    assert move.action == HOLD
    # the KV budget shrank under the ceiling (longer requests): step down to it
    move, low = decide(obs(kv_admissible_seqs=10), state(), CFG, 110.0)
    assert move.action == SHRINK and low.max_num_seqs == 10 and "KV budget admits 10" in move.reason


def test_raising_the_ceiling_also_widens_the_budget_to_hold_every_decode():
    move, new = decide(obs(ceiling_bound=0.6), state(seqs=64, tokens=64), CFG, 100.0)
    assert move.action == RAISE and (new.max_num_seqs, new.max_batched_tokens) == (128, 128)


def test_near_the_slo_it_holds():
    move, _ = decide(obs(ceiling_bound=0.6, ttft_ratio=0.9), state(), CFG, 100.0)
    assert move.action == HOLD and "near the line" in move.reason


def test_inter_token_breach_with_prefill_heavy_steps_halves_the_budget():
    move, new = decide(obs(itl_ratio=1.4, prefill_fraction=0.8), state(), CFG, 100.0)
    assert move.action == SHRINK and move.knob == "max_num_batched_tokens"
    assert (new.max_num_seqs, new.max_batched_tokens) == (32, 256)
    assert new.tokens_ceiling == 512 and new.ceiling_since_s == 100.0
    assert "batch too big" in move.reason


def test_inter_token_breach_with_decode_heavy_steps_halves_the_ceiling():
    move, new = decide(obs(itl_ratio=1.4, prefill_fraction=0.1), state(), CFG, 100.0)
    assert move.action == SHRINK and move.knob == "max_num_seqs" and new.max_num_seqs == 16
    assert new.seqs_ceiling == 32
    # R7: stay one step below the size that failed, until that memory expires
    move, _ = decide(obs(ceiling_bound=0.9), new, CFG, 110.0)
    assert move.action == HOLD
    later, _ = decide(obs(ceiling_bound=0.9), new, CFG, 100.0 + CFG.ceiling_ttl_s)
    assert later.action == RAISE and later.max_num_seqs == 32


def test_a_queue_from_arrivals_signals_scale_out_not_a_smaller_batch():
    # TTFT over, queue wait the cause, no limit binds: arrivals exceed capacity
    move, new = decide(obs(ttft_ratio=2.0, queue_ratio=1.8, busy_fraction=0.99), state(), CFG, 1.0)
    assert move.action == SCALE_OUT and not move.changed
    assert (new.max_num_seqs, new.max_batched_tokens) == (32, 512)
    assert "more replicas, not a smaller batch" in move.reason


def test_a_queue_at_the_ceiling_with_room_in_the_steps_raises_it():
    o = obs(ttft_ratio=2.0, queue_ratio=1.8, ceiling_bound=0.7, itl_ratio=0.3)
    move, new = decide(o, state(), CFG, 1.0)
    assert move.action == RAISE and new.max_num_seqs == 64
    # the same queue, but the step-cost line says 32 more decode rows would break the
    # inter-token SLO (0.1 s + 10 ms x 72 tokens > 0.8 x 0.5 s): scale out instead
    line = dict(step_fixed_s=0.1, step_per_token_s=0.01, mean_tokens_per_step=40.0, itl_slo_s=0.5)
    move, _ = decide(dataclasses.replace(o, **line), state(), CFG, 1.0)
    assert move.action == SCALE_OUT
    cheap = dict(line, step_per_token_s=0.001)  # 0.1 + 1 ms x 72 = 0.17 s: room
    move, _ = decide(dataclasses.replace(o, **cheap), state(), CFG, 1.0)
    assert move.action == RAISE


def test_a_budget_breach_cuts_to_what_the_step_cost_line_says_fits():
    # 60 ms + 0.7 ms/token, inter-token SLO 0.35 s: 0.8 x 0.35 = 0.28 s fits 314 tokens
    line = dict(step_fixed_s=0.06, step_per_token_s=0.0007, itl_slo_s=0.35)
    o = obs(itl_ratio=2.0, prefill_fraction=0.9, **line)
    move, new = decide(o, state(seqs=64, tokens=1024), CFG, 1.0)
    assert move.action == SHRINK and new.max_batched_tokens == 314 and new.tokens_ceiling == 1024
    # and a budget raise that the line predicts to break the SLO is not tried
    grow = obs(budget_bound=0.9, mean_tokens_per_step=200.0, **line)
    move, _ = decide(grow, state(seqs=64, tokens=256), CFG, 1.0)
    assert move.action == HOLD and "can grow" in move.reason


def test_slow_prefill_without_a_queue_raises_the_budget():
    move, new = decide(obs(ttft_ratio=1.5, queue_ratio=0.1), state(), CFG, 1.0)
    assert move.action == RAISE and move.knob == "max_num_batched_tokens"
    assert new.max_batched_tokens == 1024


def test_a_raise_that_cost_throughput_is_stepped_back():
    _, raised = decide(obs(ceiling_bound=0.6), state(), CFG, 100.0)
    move, back = decide(obs(ceiling_bound=0.6, tokens_per_busy_s=280.0), raised, CFG, 105.0)
    assert move.action == SHRINK and back.max_num_seqs == 32 and back.seqs_ceiling == 64
    assert "cut tokens per busy second 400 -> 280" in move.reason


def test_too_few_samples_hold_but_a_step_time_breach_still_acts():
    move, _ = decide(obs(num_samples=1, ceiling_bound=0.9), state(), CFG, 1.0)
    assert move.action == HOLD and "min_samples" in move.reason
    move, _ = decide(obs(num_samples=1, itl_ratio=3.0), state(), CFG, 1.0)
    assert move.action == SHRINK


def test_at_the_minimum_it_holds_and_says_so():
    tiny = TunerConfig(min_num_seqs=4, min_batched_tokens=32)
    move, _ = decide(obs(itl_ratio=2.0, prefill_fraction=0.0), state(seqs=4, tokens=32), tiny, 1.0)
    assert move.action == HOLD and "already at its minimum 4" in move.reason


def test_initial_state_clamps_into_the_config():
    s = initial_state(TunerConfig(max_num_seqs=64, min_batched_tokens=64), 256, 16)
    assert (s.max_num_seqs, s.max_batched_tokens) == (64, 64)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(min_num_seqs=8, max_num_seqs=4), "min_num_seqs"),
        (dict(raise_below=0.0), "raise_below"),
        (dict(min_gaps=0), "min_gaps"),
    ],
)
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        TunerConfig(**kw)


# --- the loop on a real tiny engine ------------------------------------------------------------


def test_fit_line_recovers_a_step_cost_line():
    xs = [10, 20, 40, 80, 160]
    assert fit_line(xs, [0.002 + 0.0001 * x for x in xs]) == pytest.approx((0.002, 0.0001))
    assert fit_line([64, 64, 64], [0.01, 0.012, 0.011]) == pytest.approx((0.011, 0.0))
    assert fit_line([], []) == (0.0, 0.0)


def test_window_measures_ttft_gaps_queue_and_arrivals(tokenizer, clock):
    engine = LLMEngine(
        tiny_model("llama", seed=1),
        tokenizer,
        EngineConfig(
            num_kv_blocks=64, block_size_tokens=8, max_model_len=256, max_num_seqs=2, min_num_seqs=1
        ),
        clock=clock,
    )
    window = StepWindow(clock())
    engine.observers.append(window)
    for _ in range(4):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        clock.advance(0.1)
        engine.step()
    s = window.take(clock(), engine)
    assert (s.num_arrivals, s.num_completions, s.num_first_tokens) == (4, 4, 4)
    assert s.num_gaps == 8 and s.output_tokens == 12
    assert s.itl_p99_s["interactive"] == pytest.approx(0.1)
    # two at a time: the last two are admitted at the step after the first two finished (3 steps)
    assert s.queue_wait_p99_s["interactive"] == pytest.approx(0.4)
    assert s.ceiling_bound > 0 and s.kv_bound == 0
    assert s.kv_admissible_seqs == 64 // 1  # 3 + 3 tokens fit one 8-token block
    assert s.waiting_start == 0 and s.waiting_end == 0
    assert s.num_recent_first_tokens == 4
    again = window.take(clock(), engine)
    assert again.num_arrivals == 0 and again.num_steps == 0
    # first tokens are remembered across intervals for RECENT_S seconds
    assert again.num_first_tokens == 0 and again.num_recent_first_tokens == 4
    clock.advance(31.0)
    assert window.take(clock(), engine).num_recent_first_tokens == 0


def test_engine_tuner_moves_the_engine_knobs_and_reports_each_move(tokenizer, clock):
    engine = LLMEngine(
        tiny_model("llama", seed=1),
        tokenizer,
        EngineConfig(
            num_kv_blocks=256,
            block_size_tokens=8,
            max_model_len=256,
            max_num_seqs=2,
            min_num_seqs=1,
        ),
        clock=clock,
    )
    seen = []
    slo = {"interactive": TierSlo(ttft_p99_s=100.0, itl_p99_s=100.0)}
    tuner = EngineTuner(engine, slo, clock(), interval_s=5.0, on_move=seen.append)
    # the configured budget sized the reservations (and a GPU's warm-up): never raised past it
    assert tuner.config.max_batched_tokens == engine.config.max_num_batched_tokens
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for _ in range(12):
        engine.add_request([5, 6, 7, 8], params)
    assert tuner.maybe_tune(clock()) is None  # not an interval yet
    while engine.has_unfinished():
        clock.advance(0.25)
        engine.step()
    assert clock() >= 1005.0  # 24 steps: one interval has passed
    move = tuner.maybe_tune(clock())
    assert move is not None and move.action == RAISE and move.knob == "max_num_seqs"
    assert engine.config.max_num_seqs == 4 == engine.scheduler.config.max_num_seqs
    assert engine.config.min_num_seqs == 1
    assert seen == [move] and tuner.moves[-1][1] == move


def test_observation_takes_the_worst_tier_against_its_own_slo():
    from serving.engine.window import WindowSummary

    s = WindowSummary(
        span_s=5.0, num_steps=10, busy_s=2.5, num_first_tokens=9, num_gaps=90, output_tokens=100,
        num_arrivals=10, num_completions=8, waiting_start=0, waiting_end=2, ceiling_bound=0.5,
        budget_bound=0.0, kv_bound=0.0, prefill_fraction=0.4, mean_tokens_per_step=20.0,
        step_fixed_s=0.01, step_per_token_s=0.001, avg_request_tokens=100.0, kv_admissible_seqs=9,
        ttft_p99_s={"interactive": 0.5, "analytical": 6.0}, itl_p99_s={"interactive": 0.1},
        queue_wait_p99_s={"analytical": 1.0},
    )  # fmt: skip
    slos = {"interactive": TierSlo(1.0, 0.5), "analytical": TierSlo(10.0, None)}
    o = observation(s, slos)
    assert o.ttft_ratio == pytest.approx(0.6) and o.itl_ratio == pytest.approx(0.2)
    assert o.queue_ratio == pytest.approx(0.1)
    assert o.arrivals_per_s == 2.0 and o.busy_fraction == 0.5 and o.tokens_per_busy_s == 80.0
    assert s.throughput_gain(2.0) == pytest.approx(2 * 0.03 / 0.05)


def test_few_first_tokens_in_an_interval_are_judged_over_the_recent_ones():
    from serving.engine.window import WindowSummary

    s = WindowSummary(
        span_s=2.0, num_steps=10, busy_s=2.0, num_first_tokens=1, num_gaps=90, output_tokens=100,
        num_arrivals=1, num_completions=1, waiting_start=0, waiting_end=0, ceiling_bound=0.0,
        budget_bound=0.0, kv_bound=0.0, prefill_fraction=0.4, mean_tokens_per_step=20.0,
        step_fixed_s=0.01, step_per_token_s=0.001, avg_request_tokens=100.0, kv_admissible_seqs=9,
        ttft_p99_s={"interactive": 0.1}, itl_p99_s={"interactive": 0.1},
        queue_wait_p99_s={"interactive": 0.0}, num_recent_first_tokens=6,
        recent_ttft_p99_s={"interactive": 2.5}, recent_queue_wait_p99_s={"interactive": 0.2},
    )  # fmt: skip
    slos = {"interactive": TierSlo(1.0, 0.5)}
    assert observation(s, slos).ttft_ratio == pytest.approx(0.1)  # min_samples 1: the interval
    o = observation(s, slos, min_samples=4)
    assert (o.num_samples, o.ttft_ratio, o.queue_ratio) == (6, 2.5, 0.2)
