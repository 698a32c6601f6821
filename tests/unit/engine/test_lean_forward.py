"""The lean forward (serving/engine/lean_forward.py) serves Llama-family models with the model's
own arithmetic: greedy tokens equal generate() and the model's own forward through the paged
attention; other architectures keep their own forward."""

from __future__ import annotations

import random

import pytest
import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.cpu_linear import pack_linears
from serving.engine.lean_forward import LEAN_ARCHITECTURES, supports
from serving.tiny_models import TINY_ARCHS, tiny_model
from tests.conftest import hf_greedy

LEAN = ["llama", "qwen2", "qwen2-sliding", "qwen3", "mistral"]
MAX_TOKENS = 10


def prompts(seed: int, n: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randint(30, 90))] for _ in range(n)]


def greedy_refs(model, batch) -> list[list[int]]:
    return hf_greedy(model, batch, MAX_TOKENS)


def engine_tokens(model, batch, lean: bool) -> tuple[list[list[int]], object]:
    impl = model.config._attn_implementation
    config = EngineConfig(
        num_kv_blocks=128,
        block_size_tokens=8,
        max_num_batched_tokens=48,  # chunked prefill beside decodes: both kinds of row
        max_num_seqs=4,
        min_num_seqs=2,
        runner="paged",
        lean_forward=lean,
    )
    engine = LLMEngine(model, config=config)
    try:
        outs = engine.generate(batch, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
        return [o.token_ids for o in outs], engine.runner.lean
    finally:
        model.set_attn_implementation(impl)


@pytest.mark.parametrize("arch", LEAN)
def test_lean_forward_equals_generate_and_the_models_own_forward(arch):
    model = tiny_model(arch, seed=3)
    batch = prompts(seed=11)
    refs = greedy_refs(model, batch)
    lean_out, lean = engine_tokens(model, batch, lean=True)
    own_out, own = engine_tokens(model, batch, lean=False)
    assert lean is not None and own is None  # each run took the path it names
    assert lean_out == refs
    assert own_out == refs


@pytest.mark.parametrize("arch", sorted(set(TINY_ARCHS) - set(LEAN)))
def test_other_architectures_keep_their_own_forward(arch):
    model = tiny_model(arch, seed=3)
    assert model.config.model_type not in LEAN_ARCHITECTURES
    assert not supports(model)
    _, lean = engine_tokens(model, prompts(seed=12, n=1), lean=True)
    assert lean is None


def test_lean_forward_over_packed_linears_equals_generate():
    model = tiny_model("llama", seed=4)
    batch = prompts(seed=13)
    refs = greedy_refs(model, batch)
    assert pack_linears(model, min_weight_bytes=0) > 0  # what the engine does to big models
    out, lean = engine_tokens(model, batch, lean=True)
    assert lean is not None
    assert out == refs


def test_a_layer_that_is_not_llamas_is_not_served_lean():
    model = tiny_model("llama", seed=3)

    class OtherLayer(torch.nn.Module):
        pass

    model.model.layers[1] = OtherLayer()
    assert not supports(model)


def test_lean_forward_must_be_a_bool():
    with pytest.raises(ValueError, match="lean_forward='yes' must be true or false"):
        EngineConfig(lean_forward="yes")
