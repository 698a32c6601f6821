"""Prepacked CPU linear layers (serving/engine/cpu_linear.py): same numbers as F.linear, every
plain nn.Linear replaced, nothing else touched, and an engine config that turns it off."""

from __future__ import annotations

import pytest
import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams, cpu_linear
from serving.engine.cpu_linear import PackedLinear, can_pack, pack_linears
from serving.tiny_models import tiny_model

needs_mkldnn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


@needs_mkldnn
@pytest.mark.parametrize("rows", [1, 3, 16, 93])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias)
    x = torch.randn(rows, 64)
    packed = PackedLinear(linear)
    torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    # Leading dims pass through, as with nn.Linear ([batch, tokens, hidden] in transformers).
    x3 = torch.randn(2, rows, 64)
    torch.testing.assert_close(packed(x3), linear(x3), rtol=1e-5, atol=1e-5)


@needs_mkldnn
def test_non_contiguous_input_is_accepted():
    linear = torch.nn.Linear(32, 8)
    x = torch.randn(32, 5).t()  # a transposed view
    torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)


class _LoraLike(torch.nn.Linear):
    """A subclass with its own forward: must not be replaced."""


@needs_mkldnn
def test_pack_replaces_plain_linears_only():
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Linear(8, 4)),
        _LoraLike(4, 4),
    )
    assert pack_linears(model) == 0  # a few hundred bytes: cache-resident, F.linear is faster
    assert pack_linears(model, min_weight_bytes=0) == 2
    assert isinstance(model[0], PackedLinear)
    assert isinstance(model[2][0], PackedLinear)
    assert type(model[3]) is _LoraLike


@needs_mkldnn
def test_tied_head_keeps_the_embedding_weight():
    model = tiny_model("llama", tie_word_embeddings=True)
    embed = model.get_input_embeddings().weight
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = model(ids).logits
        pack_linears(model, min_weight_bytes=0)
        after = model(ids).logits
    assert model.get_input_embeddings().weight is embed
    assert isinstance(model.lm_head, PackedLinear)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_can_pack_float32_on_cpu_and_bfloat16_only_with_native_bf16_units():
    cpu, mkldnn = torch.device("cpu"), torch.backends.mkldnn.is_available()
    avx2, zen4 = frozenset({"avx2"}), frozenset({"avx2", "avx512f", "avx512_bf16"})
    assert can_pack(cpu, torch.float32, avx2) == mkldnn
    assert not can_pack(cpu, torch.bfloat16, avx2)  # emulated bf16: not measured, stays off
    assert can_pack(cpu, torch.bfloat16, zen4) == mkldnn
    assert can_pack(cpu, torch.bfloat16, frozenset({"amx_bf16"})) == mkldnn
    assert not can_pack(cpu, torch.float16, zen4)
    assert not can_pack(torch.device("cuda"), torch.float32, zen4)


@needs_mkldnn
@pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="oneDNN's bf16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT, which this CPU lacks",
)
@pytest.mark.parametrize("rows", [1, 16, 93])
def test_packed_bfloat16_matches_f_linear_to_bf16_rounding(rows):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=False).to(torch.bfloat16)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    got, want = PackedLinear(linear)(x), linear(x)
    assert got.dtype == torch.bfloat16
    # both accumulate in float32 and round once: at most a bf16 ulp apart (2^-8 relative)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)


@needs_mkldnn
@pytest.mark.parametrize("kind", ["onednn", "off"])
def test_engine_packs_by_config_and_output_is_unchanged(kind):
    model = tiny_model("llama")  # below the auto floor: an explicit kind packs any size
    prompt = [3, 17, 42, 9, 11]
    ids = torch.tensor([prompt])
    ref = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False
    )
    engine = LLMEngine(model, config=EngineConfig(num_kv_blocks=16, cpu_linear=kind))
    assert engine.cpu_linear == kind
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    plain = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert (len(packed) > 0, len(plain) == 0) == (kind == "onednn", kind == "onednn")
    (out,) = engine.generate([prompt], [SamplingParams(max_tokens=12, temperature=0)])
    assert out.token_ids == ref[0, len(prompt) :].tolist()


def test_auto_leaves_a_cache_resident_model_alone(monkeypatch):
    def no_kernel_check():
        raise AssertionError("a model below the floor needs no kernel built or checked")

    monkeypatch.setattr(cpu_linear, "_native_probe", no_kernel_check)
    model = tiny_model("llama")
    engine = LLMEngine(model, config=EngineConfig(num_kv_blocks=16))
    assert engine.cpu_linear == "off"
    assert not [m for m in model.modules() if isinstance(m, PackedLinear)]


def test_config_names_the_allowed_kinds():
    with pytest.raises(ValueError, match=r"cpu_linear.*'auto', 'native', 'onednn', 'off'"):
        EngineConfig(cpu_linear="yes")
    with pytest.raises(TypeError, match="cpu_packed_linear"):  # the old key fails closed
        EngineConfig(cpu_packed_linear=True)


def test_resolve_picks_native_then_onednn_then_off():
    cpu, f32, bf16 = torch.device("cpu"), torch.float32, torch.bfloat16
    passes, fails = (lambda: None), (lambda: "no C compiler found")
    zen4 = frozenset({"avx512f", "avx512_bf16"})
    onednn = "onednn" if torch.backends.mkldnn.is_available() else "off"
    assert cpu_linear.resolve("auto", cpu, f32, passes) == "native"
    assert cpu_linear.resolve("auto", cpu, f32, fails) == onednn
    assert cpu_linear.resolve("auto", cpu, bf16, passes, frozenset()) == "off"
    assert cpu_linear.resolve("auto", cpu, bf16, passes, zen4) == onednn
    assert cpu_linear.resolve("auto", torch.device("cuda"), bf16, passes, zen4) == "off"
    assert cpu_linear.resolve("off", cpu, f32, passes) == "off"
    assert cpu_linear.resolve("native", cpu, f32, passes) == "native"
    with pytest.raises(ValueError, match="'native' does not work here: no C compiler found"):
        cpu_linear.resolve("native", cpu, f32, fails)
    with pytest.raises(ValueError, match=r"'native' does not work here: .*not bfloat16 on cpu"):
        cpu_linear.resolve("native", cpu, bf16, passes)
    with pytest.raises(ValueError, match="'onednn' does not work here"):
        cpu_linear.resolve("onednn", torch.device("cuda"), f32, passes)


@pytest.mark.parametrize(
    ("native_s", "onednn_s", "kind"), [(1.0, 2.0, "native"), (2.0, 1.0, "onednn")]
)
def test_auto_keeps_the_faster_kernel_on_this_machine(monkeypatch, native_s, onednn_s, kind):
    if not torch.backends.mkldnn.is_available() or cpu_linear._native_probe() is not None:
        pytest.skip("needs both the native kernel and oneDNN here")
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 0)
    raced = []

    def race(weights):
        raced.append(len(weights))
        return native_s, onednn_s

    model = tiny_model("llama")
    cpu, f32 = torch.device("cpu"), torch.float32
    assert cpu_linear.pack_if_useful(model, "auto", cpu, f32, race) == kind
    assert raced == [len([m for m in tiny_model("llama").modules() if type(m) is torch.nn.Linear])]
    assert cpu_linear.pack_if_useful(tiny_model("llama"), "native", cpu, f32, race) == "native"
    assert len(raced) == 1  # an explicit choice is not raced


def test_the_race_times_both_kernels_on_weights_within_its_budget():
    from serving.engine import cpu_matmul

    if cpu_matmul.KERNEL.get()[0] is None or not torch.backends.mkldnn.is_available():
        pytest.skip("needs both the native kernel and oneDNN here")
    small, big = torch.randn(24, 16), torch.randn(4096, 64)  # 1.5 KiB and 1 MiB
    native_s, onednn_s = cpu_matmul.race_onednn([big, small], budget_bytes=2**16, rounds=1)
    assert native_s > 0 and onednn_s > 0
