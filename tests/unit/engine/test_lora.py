"""LoRA adapters in the engine: greedy output equals PEFT's `generate` with the same adapter, for
several adapters, when one batch mixes adapters and the base model, with more adapters than slots
(LRU evictions), with preemption by recompute, and on the fallback runner.

Adapters are written by PEFT itself (serving/tiny_adapters.py) with random non-zero B, of ranks
2-8, one with rsLoRA scaling, one on the attention projections only.
"""

from __future__ import annotations

import random

import pytest
import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.tiny_adapters import save_random_lora
from serving.tiny_models import tiny_model
from tests.conftest import hf_greedy, random_prompts

ADAPTERS = {  # name -> save_random_lora keyword arguments
    "a": dict(rank=4, lora_alpha=8, seed=1),
    "b": dict(rank=8, lora_alpha=16, seed=2, use_rslora=True),
    "c": dict(rank=2, lora_alpha=4, seed=3, target_modules=("q_proj", "v_proj")),
}
NUM_PROMPTS = 6


def _generate(model, prompts, max_tokens):
    return hf_greedy(model, prompts, list(max_tokens))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def case(request, tmp_path_factory):
    """Adapters saved by PEFT and, per adapter (None: base), PEFT's greedy references."""
    from peft import PeftModel

    arch = request.param
    root = tmp_path_factory.mktemp(f"lora-{arch}")
    paths = {
        name: str(save_random_lora(tiny_model(arch), root / name, b_std=0.05, **kw))
        for name, kw in ADAPTERS.items()
    }
    prompts = random_prompts(NUM_PROMPTS, seed=21, hi=60)
    rng = random.Random(22)
    max_tokens = [rng.randint(4, 24) for _ in prompts]
    refs = {None: _generate(tiny_model(arch), prompts, max_tokens)}
    for name, path in paths.items():
        peft_model = PeftModel.from_pretrained(tiny_model(arch), path).eval()
        refs[name] = _generate(peft_model, prompts, max_tokens)
    for name in paths:
        assert refs[name] != refs[None], f"adapter {name} does not change the output"
    return arch, paths, prompts, max_tokens, refs


def _engine(arch, paths, **overrides) -> LLMEngine:
    cfg = dict(
        num_kv_blocks=400,
        block_size_tokens=8,
        max_num_batched_tokens=64,
        max_num_seqs=24,
        min_num_seqs=4,
        max_loras=2,
        max_lora_rank=8,
    )
    engine = LLMEngine(tiny_model(arch), config=EngineConfig(**{**cfg, **overrides}))
    for name, path in paths.items():
        engine.add_adapter(name, path)
    return engine


def _run_mixed(engine, prompts, max_tokens, names, seed=0):
    """Every (prompt, adapter) pair, added a few at a time between steps, shuffled so each step
    mixes adapters and the base model; returns outputs by (prompt index, adapter)."""
    jobs = [(i, name) for i in range(len(prompts)) for name in names]
    random.Random(seed).shuffle(jobs)
    rids: dict[str, tuple[int, str | None]] = {}
    outputs: dict[tuple[int, str | None], list[int]] = {}
    mixed_steps = 0
    steps = 0
    while jobs or engine.has_unfinished():
        for _ in range(random.Random(steps).randint(0, 4)):
            if jobs:
                i, name = jobs.pop()
                params = SamplingParams(max_tokens=max_tokens[i], temperature=0)
                rids[engine.add_request(prompts[i], params, adapter=name)] = (i, name)
        running = {s.adapter for s in engine.scheduler.running}
        mixed_steps += len(running) >= 3
        for seq in engine.step():
            if seq.finished:
                outputs[rids[seq.request_id]] = seq.output_token_ids
        engine.check_integrity()
        steps += 1
        assert steps < 5000
    return outputs, mixed_steps


@pytest.mark.parametrize(
    ("kv_mode", "num_kv_blocks", "runner"),
    [
        ("reserve", 400, "paged"),
        ("on_demand", 16, "paged"),  # preemption by recompute
        ("reserve", 400, "hf"),  # the fallback runner
    ],
)
def test_mixed_batches_equal_peft_generate(case, kv_mode, num_kv_blocks, runner):
    arch, paths, prompts, max_tokens, refs = case
    engine = _engine(arch, paths, kv_mode=kv_mode, num_kv_blocks=num_kv_blocks, runner=runner)
    names = [None, *ADAPTERS]
    outputs, mixed_steps = _run_mixed(engine, prompts, max_tokens, names)
    wrong = [
        (i, name)
        for i in range(len(prompts))
        for name in names
        if outputs[(i, name)] != refs[name][i]
    ]
    assert not wrong, f"{arch}/{kv_mode}/{runner}: (prompt, adapter) {wrong} differ from PEFT"
    assert mixed_steps > 0, "no step ran the base model beside two adapters"
    pool = engine.adapters.pool
    assert pool.num_evictions > 0, "3 adapters over 2 slots should have evicted"
    assert not pool.pins, "a finished request left its adapter pinned"
    stats = engine.stats()
    if kv_mode == "on_demand":
        assert stats.num_preemptions > 0, "budget meant to force preemption did not"
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_reserved == 0


def test_generate_api_takes_one_adapter_per_prompt(case):
    arch, paths, prompts, max_tokens, refs = case
    engine = _engine(arch, paths, max_loras=3)
    names = ["a", None, "b", "c", "a", None]
    params = [SamplingParams(max_tokens=n, temperature=0) for n in max_tokens]
    outs = engine.generate(prompts, params, adapters=names)
    assert [o.token_ids for o in outs] == [refs[n][i] for i, n in enumerate(names)]


def test_slot_stacks_match_the_memory_formula(case):
    from capacity.adapters import lora_slot_bytes

    arch, paths, *_ = case
    engine = _engine(arch, paths, max_loras=3, max_lora_rank=8)
    config = engine.model.config
    assert engine.adapters.slot_bytes == lora_slot_bytes(config, torch.float32, 3, 8)
    # tiny shape: hidden 64, intermediate 128, 4 heads of 16, 2 layers
    kv_out = config.num_key_value_heads * 16
    per_layer = (64 + 64) + 2 * (64 + kv_out) + (64 + 64) + 3 * (64 + 128)
    assert engine.adapters.slot_bytes == 3 * 8 * per_layer * 2 * 4
