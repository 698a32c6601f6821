"""Prefix caching changes no answer: greedy outputs are identical with the cache on and off, on
multi-turn conversations (each turn continuing in the partial block its previous reply ended in),
with chunked prefill, with preemption and recompute, and with eviction under pressure; integrity
is checked after every step. Tiny random Llama, float32."""

from __future__ import annotations

import random

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.tiny_models import tiny_model

SYSTEM = [random.Random(5).randrange(3, 500) for _ in range(37)]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def conversations(num_convs: int, num_turns: int, seed: int):
    rng = random.Random(seed)
    return [
        [[rng.randrange(3, 500) for _ in range(rng.randint(3, 20))] for _ in range(num_turns)]
        for _ in range(num_convs)
    ]


def chat(engine: LLMEngine, convs, max_tokens: int = 8) -> list[list[list[int]]]:
    """Every conversation's turns, all conversations of a turn at once; each turn resends the
    system prompt, the history (user turns and replies) and the new user message."""
    history = [list(SYSTEM) for _ in convs]
    replies: list[list[list[int]]] = [[] for _ in convs]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for turn in range(len(convs[0])):
        rids = []
        for c, conv in enumerate(convs):
            history[c] += conv[turn]
            rids.append(engine.add_request(list(history[c]), params))
        done: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for seq in engine.step():
                if seq.finished:
                    done[seq.request_id] = seq.output_token_ids
            engine.check_integrity()
        for c, rid in enumerate(rids):
            replies[c].append(done[rid])
            history[c] += done[rid]
    return replies


def both(model, convs, **cfg):
    """The replies with the cache off and on, and the engine that cached."""
    off = LLMEngine(model, config=EngineConfig(runner="paged", prefix_caching=False, **cfg))
    on = LLMEngine(model, config=EngineConfig(runner="paged", prefix_caching=True, **cfg))
    assert on.prefix_caching and not off.prefix_caching
    return chat(off, convs), chat(on, convs), on


def test_multi_turn_conversations_answer_the_same_and_hit_the_cache(model):
    convs = conversations(6, 4, seed=1)
    off, on, engine = both(model, convs, block_size_tokens=8)
    assert on == off
    stats = engine.stats()
    assert stats.prefix_cache_hit_fraction > 0.5  # turns >= 2 resend what is cached
    assert stats.prefix_cache_query_tokens > stats.prefix_cache_hit_tokens > 0
    assert engine.pool.num_partial_takeovers > 0  # turns continued in the block a reply ended in


def test_chunked_prefill_of_the_uncached_tail_answers_the_same(model):
    convs = conversations(4, 3, seed=2)
    off, on, engine = both(model, convs, block_size_tokens=4, max_num_batched_tokens=12)
    assert on == off and engine.stats().prefix_cache_hit_tokens > 0


def test_preemption_and_recompute_answer_the_same(model):
    convs = conversations(8, 3, seed=3)
    cfg = dict(
        kv_mode="on_demand", block_size_tokens=4, num_kv_blocks=40, on_demand_free_fraction=0.0
    )
    off_engine = LLMEngine(model, config=EngineConfig(runner="paged", prefix_caching=False, **cfg))
    on_engine = LLMEngine(model, config=EngineConfig(runner="paged", **cfg))
    off, on = chat(off_engine, convs, 24), chat(on_engine, convs, 24)
    assert on == off
    assert on_engine.stats().num_preemptions > 0 and off_engine.stats().num_preemptions > 0
    assert on_engine.stats().prefix_cache_hit_tokens > 0


def test_eviction_under_pressure_answers_the_same(model):
    convs = conversations(6, 4, seed=4)
    off, on, engine = both(model, convs, block_size_tokens=4, num_kv_blocks=48)
    assert on == off
    assert engine.pool.num_evicted_blocks > 0 and engine.stats().prefix_cache_hit_tokens > 0
    assert engine.pool.num_partial_takeovers > 0


def test_an_aborted_prefill_leaves_nothing_half_written_cached(model):
    cfg = EngineConfig(runner="paged", block_size_tokens=4, max_num_batched_tokens=10)
    engine = LLMEngine(model, config=cfg)
    prompt = SYSTEM[:30]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0))
    engine.step()  # 10 of 30 tokens computed: blocks 0-1 full, block 2 half-written
    engine.abort(rid)
    engine.step()
    engine.check_integrity()
    assert engine.pool.num_cached_blocks == 2
    greedy = SamplingParams(max_tokens=4, temperature=0)
    again = engine.generate([prompt], greedy)[0]
    fresh = LLMEngine(model, config=EngineConfig(runner="paged", prefix_caching=False))
    assert again.token_ids == fresh.generate([prompt], greedy)[0].token_ids


def test_caching_is_off_and_logged_for_sliding_window_models(caplog):
    engine = LLMEngine(tiny_model("mistral"), config=EngineConfig(runner="paged"))
    assert not engine.prefix_caching
    assert "prefix caching is off for this model" in caplog.text
    assert "sliding-window" in caplog.text
