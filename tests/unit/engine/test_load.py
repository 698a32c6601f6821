"""The engine's load snapshot (serving/engine/load.py) read off a real tiny engine: what the
TTFT prediction is fed is the engine's own state and measurements, no Ray."""

from __future__ import annotations

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.load import load_snapshot
from serving.llm.ttft import predict_ttft
from serving.tiny_models import tiny_model


@pytest.fixture
def engine(tokenizer, clock):
    cfg = EngineConfig(
        num_kv_blocks=64, block_size_tokens=8, max_model_len=256, max_num_seqs=2, min_num_seqs=2
    )
    return LLMEngine(tiny_model("llama", seed=3), tokenizer, cfg, clock=clock)


def test_snapshot_holds_running_remaining_waiting_per_tier_and_measured_step_cost(engine, clock):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.generate([[5, 6, 7]], params)  # one finished request: outputs of 6 tokens are typical
    assert engine.tracker.typical_output_tokens() == 6
    for prompt in ([5, 6], [7, 8], [9, 10, 11], [12]):
        engine.add_request(prompt, params)
    for _ in range(3):
        engine.add_request([1, 2, 3, 4], params, tier="offline")
    engine.step()  # two admitted (the window holds 2), two interactive and 3 offline waiting
    snap = load_snapshot(engine, clock(), engine.stats().concurrency_limit)
    assert snap.slots == 2 and len(snap.running_remaining_tokens) == 2
    assert all(r == 5 for r in snap.running_remaining_tokens)  # 6 expected, 1 generated
    assert snap.waiting["interactive"].num == 2
    assert snap.waiting["interactive"].prompt_tokens_mean == pytest.approx(2.0)
    assert snap.waiting["interactive"].output_tokens_mean == pytest.approx(6.0)
    assert snap.waiting["offline"].num == 3 and snap.waiting["analytical"].num == 0
    assert snap.step_fixed_s + snap.step_per_token_s > 0  # measured, from the engine's step log
    # Interactive and analytical wait behind the 2 running and 2 queued interactive requests
    # (the offline backlog is not ahead of them); offline behind those and 3 offline more.
    interactive = predict_ttft(snap, "interactive", 3, clock())
    analytical = predict_ttft(snap, "analytical", 3, clock())
    offline = predict_ttft(snap, "offline", 3, clock())
    assert 0 < interactive.wait_s == analytical.wait_s < offline.wait_s


def test_time_between_busy_steps_counts_in_the_step_cost(engine, clock):
    """What the event loop takes between two steps (refusals, streams to relay) is time the
    queue waits too: the snapshot's fixed step cost includes the mean gap."""
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.generate([[5, 6, 7]], params)
    quiet = load_snapshot(engine, clock(), 2)
    engine.loop_gaps_s.extend([0.02, 0.04])
    busy = load_snapshot(engine, clock(), 2)
    assert busy.step_fixed_s == pytest.approx(quiet.step_fixed_s + 0.03)
    assert busy.step_per_token_s == quiet.step_per_token_s


def test_the_driver_records_gaps_only_between_busy_steps(engine):
    import asyncio

    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)

    async def run() -> None:
        async for _ in engine.stream([5, 6, 7], params):
            pass
        await asyncio.sleep(0.05)  # idle: no gap recorded across it
        async for _ in engine.stream([5, 6], params):
            pass

    asyncio.run(run())
    # 5 busy steps per request: 4 gaps each, none for the idle time between the requests
    assert len(engine.loop_gaps_s) == 8
    assert all(0 <= g < 0.05 for g in engine.loop_gaps_s)


def test_running_offline_work_is_listed_last_and_counted(engine, clock):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.add_request([1, 2, 3, 4], params, tier="offline")
    engine.step()  # alone: offline work runs on the idle engine
    engine.add_request([5, 6], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.step()  # the interactive request takes the free slot beside it
    snap = load_snapshot(engine, clock(), engine.stats().concurrency_limit)
    assert snap.num_running_offline == 1
    # interactive first (3 asked, 1 generated), then offline (6 asked, 1 generated: it paused
    # while the interactive prompt started)
    assert snap.running_remaining_tokens == (2, 5)
