"""FlexAttention decode (serving/engine/flex_decode.py) reads the paged cache in place and
answers what SDPA over the gathered blocks answers; the engine with it equals generate().

On CPU flex_attention runs eagerly (dense over the cache), so these tests check correctness;
its speed is a GPU matter (tests/gpu, benchmarks/gpu_suite.sh).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.flex_decode import (
    decode_block_mask,
    flex_decode,
    probe_flex,
    resolve_decode_attention,
)
from tests.unit.engine.test_architectures import BLOCK, CHUNK, MAX_TOKENS, NUM_PROMPTS, arch_case

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def gathered_reference(q, cache, tables, lens, scale=None, softcap=None):
    """Row by row: the row's blocks copied out in table order, cut at its length, then SDPA
    (or the soft-capped math)."""
    bs = cache.shape[3]
    out = []
    for b, (table, n) in enumerate(zip(tables, lens, strict=True)):
        kv = cache[:, :, table].flatten(2, 3)[:, :, :n]  # [2, Hkv, n, D]
        qb = q[b].unsqueeze(1)  # [H, 1, D]
        k, v = kv[0], kv[1]
        group = qb.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        s = (qb @ k.transpose(-1, -2)) * (scale if scale is not None else qb.shape[-1] ** -0.5)
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        out.append((torch.softmax(s, -1) @ v).squeeze(1))
        assert len(table) == -(-n // bs)
    return torch.stack(out)


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_flex_decode_equals_attention_over_the_gathered_blocks(softcap):
    torch.manual_seed(0)
    heads, kv_heads, dim, bs, num_blocks = 4, 2, 8, 4, 12
    cache = torch.randn(2, kv_heads, num_blocks, bs, dim)
    # Rows own scattered blocks, one a single partial block; block 0 is a real block of row 2
    # and also the padding of rows 0 and 1 (the runner pads tables with block 0).
    tables = [[5, 2, 9], [7], [0, 3]]
    lens = [11, 2, 8]
    per_row = max(map(len, tables))
    padded = torch.tensor([t + [0] * (per_row - len(t)) for t in tables]).view(-1)
    q = torch.randn(len(tables), heads, dim)
    block_mask = decode_block_mask(padded, torch.tensor(lens), num_blocks, bs)
    got = flex_decode(q, cache, block_mask, scale=0.3, softcap=softcap)
    want = gathered_reference(q, cache, tables, lens, scale=0.3, softcap=softcap)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_padding_entry_never_hides_the_block_it_names():
    # Row 0 owns block 0 at its first entry and is padded with block 0 after it: the padding
    # must not remap block 0 to a position past the row's length (its keys would vanish).
    torch.manual_seed(1)
    cache = torch.randn(2, 1, 4, 2, 4)
    q = torch.randn(2, 1, 4)
    padded = torch.tensor([0, 0, 0, 1, 2, 3])  # row 0: [0] + padding; row 1: [1, 2, 3]
    block_mask = decode_block_mask(padded, torch.tensor([2, 5]), num_cache_blocks=4, block_size=2)
    got = flex_decode(q, cache, block_mask, scale=None, softcap=None)
    want = gathered_reference(q, cache, [[0], [1, 2, 3]], [2, 5])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_auto_is_flex_on_cuda_when_its_check_passes_and_gather_on_cpu(caplog):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    passes, fails = (lambda: None), (lambda: "RuntimeError: no kernel for this GPU")
    assert resolve_decode_attention("auto", cpu, passes) == "gather"
    assert resolve_decode_attention("auto", cuda, passes) == "flex"
    assert resolve_decode_attention("gather", cuda, passes) == "gather"
    assert resolve_decode_attention("flex", cpu, passes) == "flex"
    # a flex that fails its check: auto falls back and says why; an explicit choice is an error
    assert resolve_decode_attention("auto", cuda, fails) == "gather"
    assert "no kernel for this GPU" in caplog.text
    with pytest.raises(ValueError, match="decode_attention='flex' does not work here"):
        resolve_decode_attention("flex", cuda, fails)
    with pytest.raises(ValueError, match="decode_attention='paged'"):
        EngineConfig(decode_attention="paged")


def test_the_check_passes_on_this_cpu_and_catches_a_wrong_kernel(monkeypatch):
    cpu = torch.device("cpu")
    assert probe_flex(cpu, torch.float32, heads=4, kv_heads=2, head_dim=8, bs=4) is None
    monkeypatch.setattr(
        "serving.engine.flex_decode.flex_decode", lambda q, *a, **k: torch.zeros_like(q)
    )
    assert "differs" in probe_flex(cpu, torch.float32, heads=4, kv_heads=2, head_dim=8, bs=4)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2"])
def test_engine_with_flex_decode_equals_generate(arch, monkeypatch):
    """Greedy outputs equal generate() with every decode through FlexAttention (gemma2: its
    soft-capped global layers; its sliding layers keep the windowed gather)."""
    model, prompts, refs = arch_case(arch)
    impl = model.config._attn_implementation
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return flex_decode(*args, **kwargs)

    monkeypatch.setattr("serving.engine.flex_decode.flex_decode", counted)
    config = EngineConfig(
        num_kv_blocks=160,
        block_size_tokens=BLOCK,
        max_num_batched_tokens=CHUNK,
        max_num_seqs=NUM_PROMPTS,
        min_num_seqs=2,
        runner="paged",
        decode_attention="flex",
    )
    engine = LLMEngine(model, config=config)
    try:
        assert engine.runner.decode_attention == "flex"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
        engine.check_integrity()
    finally:
        model.set_attn_implementation(impl)
    mismatched = [i for i, (o, r) in enumerate(zip(outs, refs, strict=True)) if o.token_ids != r]
    assert not mismatched, f"{arch}: prompts {mismatched} differ from generate()"
    # every layer of every decode step went through flex (gemma2: half its layers)
    assert len(calls) >= (MAX_TOKENS - 1) * model.config.num_hidden_layers // 2


def test_sdpa_reference_is_what_the_gather_path_computes():
    # The reference above is the textbook formula; pin it to SDPA so a wrong reference cannot
    # make both sides agree.
    torch.manual_seed(2)
    cache = torch.randn(2, 2, 3, 4, 8)
    q = torch.randn(1, 2, 8)
    want = F.scaled_dot_product_attention(
        q[0].unsqueeze(1),
        cache[0, :, [2, 0]].flatten(1, 2)[:, :6],
        cache[1, :, [2, 0]].flatten(1, 2)[:, :6],
    ).squeeze(1)
    torch.testing.assert_close(gathered_reference(q, cache, [[2, 0]], [6])[0], want)
