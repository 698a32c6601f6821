"""The engine's public API: errors, deadlines, aborts, streaming, sampling, stats."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.engine import (
    EngineConfig,
    LLMEngine,
    RequestTimeoutError,
    SamplingParams,
    Tier,
)
from serving.tiny_models import save_tiny_model_dir, tiny_model

GREEDY = SamplingParams(max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3)


@pytest.fixture
def engine(model, tokenizer, clock):
    cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_model_len=256)
    return LLMEngine(model, tokenizer, cfg, clock=clock)


def test_prompt_longer_than_max_model_len_is_refused_naming_lengths(engine):
    with pytest.raises(
        ValueError,
        match=r"prompt \(250 tokens\) \+ max_tokens \(10\) = 260 tokens "
        r"exceeds max_model_len=256",
    ):
        engine.add_request([5] * 250, SamplingParams(max_tokens=10))


def test_request_larger_than_whole_kv_budget_is_refused(model):
    engine = LLMEngine(model, config=EngineConfig(num_kv_blocks=4, block_size_tokens=8))
    with pytest.raises(
        ValueError,
        match=r"needs 5 KV blocks \(40 tokens\) but the whole KV "
        r"budget is 4 blocks \(32 tokens\)",
    ):
        engine.add_request([5] * 30, SamplingParams(max_tokens=10))
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "prompt is empty"),
        ([5, 99999], "token id 99999 is out of range; allowed: 0 <= id < 512"),
    ],
)
def test_bad_prompts(engine, prompt, message):
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, GREEDY)


def test_duplicate_live_request_id_is_refused(engine):
    engine.add_request([5, 6], GREEDY, request_id="same")
    with pytest.raises(ValueError, match="request_id='same' is already in flight"):
        engine.add_request([7, 8], GREEDY, request_id="same")
    while engine.has_unfinished():
        engine.step()
    engine.add_request([7, 8], GREEDY, request_id="same")  # free again once finished
    engine.check_integrity()


def test_unknown_tier_is_named(engine):
    with pytest.raises(
        ValueError,
        match=r"tier='urgent' is not allowed; choose one of "
        r"\['interactive', 'analytical', 'offline'\]",
    ):
        engine.add_request([5, 6], GREEDY, tier="urgent")


def test_text_prompts_use_the_tokenizer(engine, tokenizer):
    (out,) = engine.generate(["def hello(world):"], SamplingParams(max_tokens=5, temperature=0))
    assert out.prompt_token_ids == tokenizer("def hello(world):").input_ids
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_waiting_past_deadline_fails_with_clear_error(model, clock):
    cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_num_seqs=1, min_num_seqs=1)
    engine = LLMEngine(model, config=cfg, clock=clock)
    engine.add_request([5] * 4, SamplingParams(max_tokens=30, temperature=0))
    late = engine.add_request([6] * 4, GREEDY, timeout_s=0.5)
    engine.step()
    clock.advance(0.6)
    touched = engine.step()
    (seq,) = [s for s in touched if s.request_id == late]
    assert seq.finish_reason == "timeout"
    assert "past its deadline of 0.500 s" in seq.error
    assert engine.stats().num_timeouts == 1
    engine.check_integrity()


def test_abort_frees_every_block_and_reservation(engine):
    rids = [
        engine.add_request([5] * 20, SamplingParams(max_tokens=40, temperature=0)) for _ in range(5)
    ]
    for _ in range(3):
        engine.step()
    assert engine.stats().num_kv_blocks_used > 0
    for rid in rids:
        engine.abort(rid)
    touched = engine.step()
    assert sorted(s.request_id for s in touched) == sorted(rids)
    assert all(s.finish_reason == "abort" for s in touched)
    stats = engine.stats()
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_reserved == 0
    assert not engine.has_unfinished()
    engine.check_integrity()


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(engine):
    sampled = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=123)
    a, b = engine.generate([[5, 6, 7], [5, 6, 7]], [sampled, sampled])
    assert a.token_ids == b.token_ids
    (greedy,) = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0))
    (top1,) = engine.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=12, temperature=1.5, top_k=1, seed=1)
    )
    assert top1.token_ids == greedy.token_ids


def test_engine_seed_makes_unseeded_sampling_repeatable(model, tokenizer, clock):
    unseeded = SamplingParams(max_tokens=12, temperature=1.5)

    def run(seed: int) -> list[list[int]]:
        cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_model_len=256, seed=seed)
        outs = LLMEngine(model, tokenizer, cfg, clock=clock).generate([[5, 6, 7]] * 3, unseeded)
        return [o.token_ids for o in outs]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop_token_ids_end_generation(engine):
    (free,) = engine.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    )
    stop_at = free.token_ids[3]
    first = free.token_ids.index(stop_at)
    (stopped,) = engine.generate(
        [[5, 6, 7]],
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[stop_at]),
    )
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"


def test_stream_yields_every_token_and_the_final_text(engine):
    (ref,) = engine.generate(["hello"], SamplingParams(max_tokens=10, temperature=0))

    async def collect():
        return [
            d async for d in engine.stream("hello", SamplingParams(max_tokens=10, temperature=0))
        ]

    deltas = asyncio.run(collect())
    assert [t for d in deltas for t in d.token_ids] == ref.token_ids
    assert "".join(d.text for d in deltas) == ref.text
    assert deltas[-1].finished and deltas[-1].finish_reason == ref.finish_reason
    assert all(not d.finished for d in deltas[:-1])
    assert deltas[0].queue_wait_s is not None and deltas[0].queue_wait_s >= 0
    engine.check_integrity()


def test_a_slow_consumer_gets_merged_deltas_and_loses_nothing(engine):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    (ref,) = engine.generate([[5, 6, 7]], params)

    async def slow():
        deltas = []
        async for d in engine.stream([5, 6, 7], params):
            deltas.append(d)
            await asyncio.sleep(0.2)  # the engine runs ahead while this consumer sleeps
        return deltas

    deltas = asyncio.run(slow())
    assert len(deltas) < 30  # several steps per delta
    assert [t for d in deltas for t in d.token_ids] == ref.token_ids
    assert "".join(d.text for d in deltas) == ref.text
    assert deltas[-1].finished and deltas[-1].num_output_tokens == 30


def test_stream_interval_sends_first_token_alone_then_coalesces_and_decodes_once(engine):
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    (ref,) = engine.generate([[5, 6, 7]], params)
    decodes = []
    original = engine.decode
    engine.decode = lambda ids: decodes.append(len(ids)) or original(ids)

    async def collect():
        return [d async for d in engine.stream([5, 6, 7], params, interval_s=0.05)]

    deltas = asyncio.run(collect())
    assert len(deltas[0].token_ids) == 1  # the first token is not held back (TTFT)
    assert len(deltas) < 15  # a tiny model's steps take ms: many tokens per 50 ms message
    assert [t for d in deltas for t in d.token_ids] == ref.token_ids
    assert "".join(d.text for d in deltas) == ref.text
    assert len(decodes) == 2 * len(deltas)  # two short windows per message, not per token
    assert deltas[-1].finished and deltas[-1].num_output_tokens == 30


def test_a_stream_end_does_not_wait_out_the_interval(engine):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def collect():
        t0 = time.monotonic()
        deltas = [d async for d in engine.stream([5, 6, 7], params, interval_s=30.0)]
        return deltas, time.monotonic() - t0

    deltas, elapsed_s = asyncio.run(collect())
    assert sum(len(d.token_ids) for d in deltas) == 12 and deltas[-1].finished
    assert len(deltas) == 2 and elapsed_s < 15.0  # the last delta left when it was ready


def test_concurrent_streams_and_a_cancelled_one_leaks_nothing(engine):
    async def main():
        async def consume(prompt, n):
            return [
                d async for d in engine.stream(prompt, SamplingParams(max_tokens=n, temperature=0))
            ]

        async def give_up_early():
            async for _ in engine.stream([9, 9, 9], SamplingParams(max_tokens=50, temperature=0)):
                break  # client disconnects after the first token

        results = await asyncio.gather(consume([5, 6], 6), consume([7, 8, 9], 9), give_up_early())
        for _ in range(100):  # the abort lands at the next step of the loop
            if not engine.has_unfinished():
                break
            await asyncio.sleep(0.01)
        return results

    a, b, _ = asyncio.run(main())
    assert sum(len(d.token_ids) for d in a) <= 6 and a[-1].finished
    assert b[-1].finished
    stats = engine.stats()
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_reserved == 0


def test_stream_raises_timeout_error(model):
    cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_num_seqs=1, min_num_seqs=1)
    engine = LLMEngine(model, config=cfg)

    async def main():
        hog = asyncio.ensure_future(
            asyncio.gather(
                *[
                    _drain(
                        engine.stream(
                            [5] * 4, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
                        )
                    )
                ]
            )
        )
        await asyncio.sleep(0)
        with pytest.raises(RequestTimeoutError, match="past its deadline"):
            await _drain(engine.stream([6] * 4, GREEDY, timeout_s=0.01))
        await hog

    asyncio.run(main())


async def _drain(stream):
    return [d async for d in stream]


def test_generate_refuses_while_the_async_loop_serves(engine):
    async def main():
        agen = engine.stream([5, 6], SamplingParams(max_tokens=3, temperature=0))
        await agen.__anext__()
        with pytest.raises(RuntimeError, match="use stream"):
            engine.generate([[5]], GREEDY)
        await agen.aclose()

    asyncio.run(main())


def test_requests_submitted_since_the_last_step_count_as_waiting(engine):
    engine.add_request([5, 6], GREEDY, tier="analytical")
    engine.add_request([5, 6], GREEDY, tier="analytical")
    assert engine.stats().waiting_by_tier["analytical"] == 2  # before any step ran
    engine.step()
    assert engine.stats().waiting_by_tier["analytical"] == 0


def test_stats_report_tiers_blocks_and_queue_wait(engine, clock):
    engine.add_request([5] * 10, SamplingParams(max_tokens=20, temperature=0), tier="analytical")
    engine.add_request([5] * 10, SamplingParams(max_tokens=20, temperature=0), tier="offline")
    clock.advance(0.25)
    engine.step()
    clock.advance(0.1)
    engine.step()
    stats = engine.stats()
    assert stats.running_by_tier["analytical"] == 1
    assert stats.running_by_tier["offline"] == 1  # KV use 6% < offline_idle_fraction
    assert stats.num_kv_blocks_total == 64
    assert stats.num_kv_blocks_reserved == 8  # 2 x (30 tokens in 8-token blocks)
    assert 0 < stats.num_kv_blocks_used <= stats.num_kv_blocks_reserved
    assert stats.queue_wait_p50_s == pytest.approx(0.25)
    assert stats.tokens_per_s > 0


def test_from_pretrained_loads_a_local_model_directory(tmp_path, model):
    path = save_tiny_model_dir(tmp_path / "tiny", arch="qwen2", seed=5)
    engine = LLMEngine.from_pretrained(path, EngineConfig(num_kv_blocks=32, block_size_tokens=8))
    assert engine.tokenizer is not None
    (out,) = engine.generate(
        ["The capital of France is"], SamplingParams(max_tokens=4, temperature=0)
    )
    assert len(out.token_ids) >= 1 and isinstance(out.text, str)


def test_engine_config_errors_name_field_value_and_range():
    with pytest.raises(
        ValueError,
        match=r"EngineConfig.kv_mode='lazy' is not allowed; choose one "
        r"of \['reserve', 'on_demand'\]",
    ):
        EngineConfig(kv_mode="lazy")
    with pytest.raises(
        ValueError,
        match=r"EngineConfig.min_num_seqs=80 is out of range; "
        r"allowed: 1 <= min_num_seqs <= 64",
    ):
        EngineConfig(min_num_seqs=80)
    with pytest.raises(ValueError, match=r"EngineConfig.block_size_tokens=0 is out of range"):
        EngineConfig(block_size_tokens=0)
    with pytest.raises(ValueError, match=r"EngineConfig.seed=-1 is out of range"):
        EngineConfig(seed=-1)
    with pytest.raises(
        ValueError,
        match=r"max_model_len=5000 is out of range; allowed: "
        r"1 <= max_model_len <= 1024",
    ):
        LLMEngine(tiny_model("llama"), config=EngineConfig(max_model_len=5000))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 3.0}, r"SamplingParams.temperature=3.0 is out of range; allowed: 0.0 <= "),
        ({"top_p": 0.0}, r"SamplingParams.top_p=0.0 is out of range; allowed: 0.0 < top_p <= 1.0"),
        ({"max_tokens": 0}, r"SamplingParams.max_tokens=0 is out of range"),
        ({"top_k": -1}, r"SamplingParams.top_k=-1 is out of range"),
        ({"max_tokens": "8"}, r"SamplingParams.max_tokens='8' must be an integer"),
    ],
)
def test_sampling_params_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_public_reads_of_the_queues_and_a_hook_that_sees_each_batch_before_the_forward(engine):
    seen = []
    engine.schedule_hooks.append(
        lambda batch: seen.append([(s.request_id, s.num_computed_tokens) for s in batch.seqs])
    )
    a = engine.add_request([5, 6, 7], SamplingParams(max_tokens=2, temperature=0))
    b = engine.add_request([8, 9], SamplingParams(max_tokens=2, temperature=0), tier="offline")
    assert engine.waiting_requests() == [] and engine.stats().num_waiting == 2  # still in inbox
    engine.step()  # offline waits while an interactive prompt starts
    assert [s.request_id for s in engine.running_requests()] == [a]
    assert [s.request_id for s in engine.waiting_requests(Tier.OFFLINE)] == [b]
    assert engine.num_waiting() == 1 and engine.waiting_requests(Tier.INTERACTIVE) == []
    engine.step()
    assert seen == [[(a, 0)], [(a, 3), (b, 0)]]  # each row's context before its step
