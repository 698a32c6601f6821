"""The engine on CUDA (docs/design.md: tests/gpu, marked, skipped without a device)."""

from __future__ import annotations

import pytest
import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.flex_decode import probe_flex
from serving.tiny_models import tiny_model
from tests.conftest import random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _reference(model, prompts, max_tokens):
    refs = []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
        refs.append(out[0, len(p) :].tolist())
    return refs


@pytest.mark.parametrize("kv_mode", ["reserve", "on_demand"])
def test_float32_on_cuda_equals_generate(kv_mode):
    model = tiny_model("qwen2").to("cuda")
    prompts = random_prompts(16, seed=21)
    refs = _reference(model, prompts, 24)
    cfg = EngineConfig(
        kv_mode=kv_mode,
        num_kv_blocks=48 if kv_mode == "on_demand" else 400,
        block_size_tokens=16,
        device="cuda",
        dtype="float32",
    )
    engine = LLMEngine(model, config=cfg)
    outs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0))
    assert [o.token_ids for o in outs] == refs
    engine.check_integrity()
    assert engine.stats().num_kv_blocks_used == 0


def test_bfloat16_on_cuda_runs_and_mostly_agrees_with_generate():
    # bf16 rounding differs between a packed paged forward and generate()'s padded one, so exact
    # equality is not promised; the first tokens must agree and every request must finish.
    model = tiny_model("llama", dtype=torch.bfloat16).to("cuda")
    prompts = random_prompts(16, seed=22)
    refs = _reference(model, prompts, 16)
    engine = LLMEngine(model, config=EngineConfig(device="cuda", dtype="bfloat16"))
    assert engine.kv_cache.dtype == torch.bfloat16 and engine.kv_cache.is_cuda
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0))
    first_agree = sum(o.token_ids[0] == r[0] for o, r in zip(outs, refs, strict=True))
    assert first_agree >= 14, f"only {first_agree}/16 first tokens agree"
    assert all(o.finish_reason in ("stop", "length") for o in outs)


def test_flex_decode_is_the_cuda_default_when_it_compiles_and_equals_the_gather_path():
    # auto picks FlexAttention (compiled, reading the cache in place) on CUDA when its start-up
    # check passes on this GPU and torch (on an H200 with torch 2.11 it did not compile for
    # 16-token blocks, and auto kept the gather path); either way, in float32 the greedy outputs
    # equal the gather + SDPA path's token for token.
    model = tiny_model("qwen3").to("cuda")
    prompts = random_prompts(16, seed=23)
    cfg0 = model.config
    head_dim = getattr(cfg0, "head_dim", cfg0.hidden_size // cfg0.num_attention_heads)
    check = probe_flex(
        torch.device("cuda"), torch.float32, cfg0.num_attention_heads,
        cfg0.num_key_value_heads, head_dim, 16,
    )  # fmt: skip
    outs = {}
    for choice in ("auto", "gather"):
        cfg = EngineConfig(
            device="cuda",
            dtype="float32",
            decode_attention=choice,
            num_kv_blocks=400,  # not 90% of the GPU each: two engines live in this test
            block_size_tokens=16,
        )
        engine = LLMEngine(model, config=cfg)
        want = ("flex" if check is None else "gather") if choice == "auto" else "gather"
        assert engine.runner.decode_attention == want, check
        done = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0))
        outs[choice] = [o.token_ids for o in done]
        engine.check_integrity()
    assert outs["auto"] == outs["gather"]
