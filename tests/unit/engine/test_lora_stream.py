"""The serving path of an adapter request: engine.stream(adapter=...) (what a replica calls)
generates what engine.generate does with that adapter, and the engine's stats count the slot
traffic the replica exports (hits, loads, evictions, the adapters in slots)."""

from __future__ import annotations

import asyncio

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.tiny_adapters import save_random_lora
from serving.tiny_models import tiny_model

GREEDY = SamplingParams(max_tokens=8, temperature=0)
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-stream")
    return {
        name: str(save_random_lora(tiny_model("llama"), root / name, rank=4, seed=s, b_std=0.05))
        for name, s in (("a", 1), ("b", 2))
    }


def engine_with(paths, max_loras=1) -> LLMEngine:
    cfg = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_loras=max_loras, max_lora_rank=4)
    engine = LLMEngine(tiny_model("llama"), config=cfg)
    for name, path in paths.items():
        engine.add_adapter(name, path)
    return engine


def streamed(engine, *adapters):
    """One stream per adapter, one after another, on one event loop (a replica's)."""

    async def collect():
        outs = []
        for adapter in adapters:
            out = []
            async for d in engine.stream(PROMPT, GREEDY, adapter=adapter):
                out += d.token_ids
            outs.append(out)
        return outs

    return asyncio.run(collect())


def test_a_stream_of_an_adapter_generates_what_generate_does_with_it(paths):
    engine = engine_with(paths)
    (ref_a,) = engine_with(paths).generate([PROMPT], GREEDY, adapters="a")
    (ref_base,) = engine_with(paths).generate([PROMPT], GREEDY)
    assert ref_a.token_ids != ref_base.token_ids
    assert streamed(engine, "a", None) == [ref_a.token_ids, ref_base.token_ids]


def test_stats_count_hits_loads_and_evictions_of_the_slots(paths):
    engine = engine_with(paths, max_loras=1)
    assert engine.stats().lora_slots_total == 1 and engine.stats().num_lora_loads == 0
    streamed(engine, "a", "a", "b", "a")  # load a, hit a, b evicts a, a evicts b
    stats = engine.stats()
    assert (stats.num_lora_hits, stats.num_lora_loads, stats.num_lora_evictions) == (1, 3, 2)
    assert stats.lora_in_slots == ("a",)
    load_s = stats.lora_load_s  # the three slot writes, timed
    assert load_s > 0
    streamed(engine, "a")  # a hit writes nothing
    assert engine.stats().lora_load_s == load_s


def test_an_unregistered_adapter_is_refused_naming_the_loaded_ones(paths):
    with pytest.raises(ValueError, match=r"adapter='zz' is not loaded.*\['a', 'b'\]"):
        streamed(engine_with(paths), "zz")
