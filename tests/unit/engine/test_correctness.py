"""Correctness oracle (decision 1, docs/design.md): greedy output equals model.generate token for
token.

32+ requests of 1-200 prompt tokens and 1-64 new tokens, arriving while others run, on tiny
random-weight Llama (MHA) and Qwen2 (GQA) models in float32, in both KV modes, with a KV budget
small enough that on_demand preempts. Integrity is checked after every step.
"""

from __future__ import annotations

import random

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine import runner as runner_mod
from serving.tiny_models import tiny_model
from tests.conftest import hf_greedy, random_prompts

NUM_REQUESTS = 36


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_refs(request):
    model = tiny_model(request.param)
    prompts = random_prompts(NUM_REQUESTS, seed=11)
    rng = random.Random(12)
    max_tokens = [rng.randint(1, 64) for _ in prompts]
    refs = hf_greedy(model, prompts, max_tokens)
    return request.param, model, prompts, max_tokens, refs


def run_staggered(engine, prompts, max_tokens, seed=0):
    """Add requests a few at a time between steps, so they arrive while others run."""
    rng = random.Random(seed)
    pending = list(range(len(prompts)))
    rids: dict[int, str] = {}
    outputs: dict[str, list[int]] = {}
    steps = 0
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                i = pending.pop(0)
                rids[i] = engine.add_request(
                    prompts[i], SamplingParams(max_tokens=max_tokens[i], temperature=0)
                )
        for seq in engine.step():
            if seq.finished:
                outputs[seq.request_id] = seq.output_token_ids
        engine.check_integrity()
        steps += 1
        assert steps < 10_000
    return [outputs[rids[i]] for i in range(len(prompts))]


@pytest.mark.parametrize(
    ("kv_mode", "num_kv_blocks", "runner"),
    [
        ("reserve", 120, "paged"),  # tight: few requests fit at once
        ("reserve", 1200, "paged"),  # roomy: many decodes of mixed lengths, in several groups
        ("on_demand", 48, "paged"),  # forces preemption and recompute
        ("on_demand", 48, "hf"),  # the fallback runner
    ],
)
def test_greedy_equals_hf_generate(model_and_refs, kv_mode, num_kv_blocks, runner, monkeypatch):
    arch, model, prompts, max_tokens, refs = model_and_refs
    num_groups: list[int] = []
    original = runner_mod.group_by_length

    def spy(ctx, **kw):
        groups = original(ctx, **kw)
        num_groups.append(len(groups))
        return groups

    monkeypatch.setattr(runner_mod, "group_by_length", spy)
    config = EngineConfig(
        kv_mode=kv_mode,
        num_kv_blocks=num_kv_blocks,
        block_size_tokens=8,
        max_num_batched_tokens=96,
        max_num_seqs=24,
        min_num_seqs=4,
        runner=runner,
    )
    engine = LLMEngine(model, config=config)
    outs = run_staggered(engine, prompts, max_tokens)
    mismatched = [i for i, (o, r) in enumerate(zip(outs, refs, strict=True)) if o != r]
    assert not mismatched, f"{arch}/{kv_mode}: requests {mismatched} differ from generate()"
    stats = engine.stats()
    if kv_mode == "on_demand":
        assert stats.num_preemptions > 0, "budget meant to force preemption did not"
    else:
        assert stats.num_preemptions == 0
    assert stats.num_kv_blocks_used == 0 and stats.num_kv_blocks_reserved == 0
    assert stats.num_finished == NUM_REQUESTS
    if num_kv_blocks >= 1200:
        assert max(num_groups) > 1, "the roomy case should batch decodes in several groups"
    model.set_attn_implementation("sdpa")  # give the module-scoped model back unchanged


def test_generate_api_matches_and_reports_timings(model_and_refs):
    _, model, prompts, max_tokens, refs = model_and_refs
    engine = LLMEngine(model, config=EngineConfig(num_kv_blocks=400, block_size_tokens=16))
    params = [SamplingParams(max_tokens=n, temperature=0) for n in max_tokens[:8]]
    outs = engine.generate(prompts[:8], params)
    assert [o.token_ids for o in outs] == refs[:8]
    for o, n in zip(outs, max_tokens[:8], strict=True):
        assert o.finish_reason == ("length" if len(o.token_ids) == n else "stop")
        assert o.ttft_s is not None and o.latency_s >= o.ttft_s >= o.queue_wait_s >= 0
    model.set_attn_implementation("sdpa")
