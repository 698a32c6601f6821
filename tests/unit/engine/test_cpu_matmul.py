"""The CPU matmul kernel (serving/engine/cpu_matmul.py) computes what F.linear computes at every
row count and width its tiles meet, with one thread or two; `cpu_linear: native` packs an
engine's linear layers with it and greedy tokens do not change."""

from __future__ import annotations

import random

import pytest
import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams, cpu_matmul
from serving.engine.cpu_matmul import NativeLinear, pack
from serving.tiny_models import tiny_model
from tests.conftest import hf_greedy


def kernel_or_skip():
    fn, why = cpu_matmul.KERNEL.get()
    if fn is None:
        pytest.skip(f"the CPU matmul kernel is not available here: {why}")


def linear(in_features, out_features, bias, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features, bias=bias)


@pytest.mark.parametrize("rows", [1, 5, 8, 9, 16, 17, 24, 40, 133])
@pytest.mark.parametrize("shape", [(64, 96), (40, 13), (7, 1), (130, 200)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(rows, shape, bias):
    kernel_or_skip()
    layer = linear(*shape, bias)
    x = torch.randn(rows, shape[0])
    with torch.no_grad():
        torch.testing.assert_close(NativeLinear(layer)(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_split_the_panels_without_changing_the_result(threads):
    kernel_or_skip()
    layer = linear(96, 300, True)
    x = torch.randn(3, 11, 96)  # leading dims kept
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            got = NativeLinear(layer)(x)
    finally:
        torch.set_num_threads(before)
    assert got.shape == (3, 11, 300)
    torch.testing.assert_close(got, layer(x).detach(), rtol=1e-5, atol=1e-5)


def test_pack_is_panels_of_six_columns_k_major_zero_padded():
    weight = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)  # N=8, K=3
    packed = pack(weight)
    assert packed.shape == (2, 3, 6)
    assert packed[0, 2].tolist() == weight[:6, 2].tolist()  # panel 0, k=2: columns 0..5
    assert packed[1, 0].tolist() == [weight[6, 0], weight[7, 0], 0, 0, 0, 0]


def test_refuses_what_it_does_not_compute():
    kernel_or_skip()
    with pytest.raises(ValueError, match="float32 CPU weights"):
        NativeLinear(torch.nn.Linear(4, 4).to(torch.bfloat16))
    native = NativeLinear(linear(8, 4, False))
    with pytest.raises(ValueError, match=r"got torch.float64 input of shape \(2, 8\)"):
        native(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"shape \(2, 9\)"):
        native(torch.randn(2, 9))
    assert native(torch.randn(0, 8)).shape == (0, 4)


def test_the_start_up_check_passes_where_the_kernel_builds():
    kernel_or_skip()
    assert cpu_matmul.probe() is None


def test_engine_with_native_linears_keeps_generates_greedy_tokens():
    kernel_or_skip()
    model = tiny_model("qwen2", seed=4)  # q/k/v projections with a bias
    rng = random.Random(5)
    batch = [[rng.randrange(3, 500) for _ in range(rng.randint(5, 60))] for _ in range(5)]
    refs = hf_greedy(model, batch, 10)
    impl = model.config._attn_implementation
    config = EngineConfig(num_kv_blocks=128, block_size_tokens=8, cpu_linear="native")
    try:
        engine = LLMEngine(model, config=config)
        assert engine.cpu_linear == "native"
        assert any(isinstance(m, NativeLinear) for m in model.modules())
        outs = engine.generate(batch, SamplingParams(max_tokens=10, temperature=0))
    finally:
        model.set_attn_implementation(impl)
    assert [o.token_ids for o in outs] == refs
