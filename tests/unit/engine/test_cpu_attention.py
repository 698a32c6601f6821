"""The CPU decode attention kernel (serving/engine/cpu_attention.py) reads the paged cache in place
and computes what the gather path computes; it is built once per machine, chosen by `auto` on CPU
when its check passes, refused by name when it cannot serve, and greedy tokens do not change."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest
import torch

from serving.engine import (
    EngineConfig,
    LLMEngine,
    SamplingParams,
    attention,
    cpu_attention,
    native_build,
)
from serving.engine.attention import DecodeGroup, PagedMetadata, _Spec
from serving.engine.flex_decode import resolve_decode_attention
from serving.tiny_models import tiny_model
from tests.conftest import hf_greedy

CPU = torch.device("cpu")


def kernel_or_skip():
    fn, why = cpu_attention.kernel()
    if fn is None:
        pytest.skip(f"the CPU kernel is not available here: {why}")


def decode_both(heads, kv_heads, dim, block_size, lens, seed=0, scale=None):
    """(native, gather) outputs of one decode group over a shuffled cache with padded tables."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    per_row = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * per_row + 3
    cache = torch.randn(2, kv_heads, num_blocks, block_size, dim, generator=gen)
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables = []
    for i, n in enumerate(lens):  # own blocks, then padding that names some other block
        own = ids[i * per_row : i * per_row + -(-n // block_size)]
        tables += own + [ids[-1]] * (per_row - len(own))
    blocks = torch.tensor(tables)
    lens_t = torch.tensor(lens)
    q = torch.randn(len(lens), heads, dim, generator=gen).transpose(0, 1)  # [H, T, D] view
    mask = torch.arange(per_row * block_size).unsqueeze(0) < lens_t.unsqueeze(1)
    group = DecodeGroup(0, len(lens), blocks, mask.view(1, len(lens), 1, -1), lens_t)
    spec = _Spec(scale=scale, window=None, softcap=None)
    out = {}
    for path in ("native", "gather"):
        paged = PagedMetadata(cache, blocks, decode_attention=path)
        out[path] = attention._decode(q, cache, group, spec, paged, blocks)
    return out["native"], out["gather"]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block_size"),
    [(9, 3, 64, 16), (4, 4, 128, 8), (8, 2, 32, 4), (6, 1, 24, 16)],  # D = 64, 128, generic
)
def test_the_kernel_equals_the_gather_path(heads, kv_heads, dim, block_size):
    kernel_or_skip()
    lens = [1, block_size, block_size + 1, 3 * block_size - 1, 57]
    native, gather = decode_both(heads, kv_heads, dim, block_size, lens, scale=0.3)
    torch.testing.assert_close(native, gather, rtol=1e-5, atol=1e-5)


def test_scores_far_apart_do_not_overflow_the_softmax():
    kernel_or_skip()
    native, gather = decode_both(4, 2, 64, 8, [40, 3], seed=5, scale=40.0)
    assert torch.isfinite(native).all()
    torch.testing.assert_close(native, gather, rtol=1e-5, atol=1e-5)


def test_a_block_id_outside_the_cache_is_refused_not_read():
    kernel_or_skip()
    cache = torch.zeros(2, 1, 4, 8, 16)
    q = torch.zeros(1, 2, 16)
    tables = torch.tensor([[1, 9]])  # block 9 of 4
    with pytest.raises(RuntimeError, match="a bad block id"):
        cpu_attention.decode(q, cache, tables, torch.tensor([12]), None)
    with pytest.raises(RuntimeError, match="a length past its block table"):
        cpu_attention.decode(q, cache, torch.tensor([[1, 2]]), torch.tensor([17]), None)


def test_the_build_is_keyed_by_source_flags_and_cpu():
    root = Path("/cache")
    path = cpu_attention.KERNEL.library_path
    a = path(root, b"src", frozenset({"avx2"}))
    assert a.parent == root / "kernels" and a.name.startswith("cpu_attention-")
    assert a == path(root, b"src", frozenset({"avx2"}))
    assert a != path(root, b"src2", frozenset({"avx2"}))
    assert a != path(root, b"src", frozenset({"avx2", "avx512f"}))


def test_without_a_compiler_the_reason_is_given(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDESERVE_CACHE", str(tmp_path))  # nothing built here yet
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    assert cpu_attention.KERNEL.load() == "no C compiler found ($CC, cc or gcc)"


def test_a_compiler_error_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDESERVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native_build, "compiler", lambda: "false")  # exits 1, prints nothing
    why = cpu_attention.KERNEL.load()
    assert isinstance(why, str) and why.startswith("the C compiler failed")
    assert not list((tmp_path / "kernels").glob("*.so*"))  # no half-written library left


def test_auto_takes_the_kernel_on_cpu_only_when_its_check_passes(caplog):
    caplog.set_level(logging.INFO, logger="serving.engine.flex_decode")
    cuda = torch.device("cuda")
    passes, fails = (lambda: None), (lambda: "the KV cache is bfloat16")
    assert resolve_decode_attention("auto", CPU, None, passes) == "native"
    assert resolve_decode_attention("auto", CPU, None, fails) == "gather"
    assert "the KV cache is bfloat16" in caplog.text
    assert resolve_decode_attention("native", CPU, None, passes) == "native"
    assert resolve_decode_attention("gather", CPU, None, passes) == "gather"
    with pytest.raises(ValueError, match="'native' does not work here: the KV cache is bfloat16"):
        resolve_decode_attention("native", CPU, None, fails)
    with pytest.raises(ValueError, match="'native' does not work here: it is a CPU kernel"):
        resolve_decode_attention("native", cuda, None, passes)
    with pytest.raises(ValueError, match="'auto', 'gather', 'flex', 'native'"):
        EngineConfig(decode_attention="kernel")


def test_the_check_refuses_a_half_precision_cache_and_passes_float32():
    assert "bfloat16" in cpu_attention.probe_native(torch.bfloat16, 9, 3, 64, 16)
    kernel_or_skip()
    assert cpu_attention.probe_native(torch.float32, 9, 3, 64, 16) is None


def test_engine_with_the_kernel_keeps_generates_greedy_tokens():
    kernel_or_skip()
    model = tiny_model("llama", seed=5)
    rng = random.Random(3)
    batch = [[rng.randrange(3, 500) for _ in range(rng.randint(20, 70))] for _ in range(5)]
    refs = hf_greedy(model, batch, 10)
    impl = model.config._attn_implementation
    config = EngineConfig(
        num_kv_blocks=128,
        block_size_tokens=8,
        max_num_batched_tokens=48,
        max_num_seqs=4,
        min_num_seqs=2,
        runner="paged",
        decode_attention="native",
    )
    try:
        engine = LLMEngine(model, config=config)
        assert engine.runner.decode_attention == "native"
        outs = engine.generate(batch, SamplingParams(max_tokens=10, temperature=0))
    finally:
        model.set_attn_implementation(impl)
    assert [o.token_ids for o in outs] == refs
