"""capacity.memory is the one formula; these are its worked examples (R4, docs/requirements.md)."""

from __future__ import annotations

import pytest

from capacity import memory

LLAMA2_7B = dict(num_hidden_layers=32, num_attention_heads=32, hidden_size=4096)
LLAMA3_8B = dict(
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096
)
MISTRAL_7B = dict(
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096
)
QWEN2_7B = dict(
    num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584
)
# Gemma-7B: head_dim 256 although hidden_size / heads = 192; the explicit value must win.
GEMMA_7B = dict(
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=16,
    hidden_size=3072,
    head_dim=256,
)


@pytest.mark.parametrize(
    ("config", "dtype", "expected"),
    [
        (LLAMA2_7B, "float16", 32 * 32 * 128 * 2 * 2),  # MHA: 524,288 bytes per token
        (LLAMA3_8B, "bfloat16", 131_072),  # GQA: 8 KV heads
        (MISTRAL_7B, "fp16", 131_072),
        (QWEN2_7B, "bf16", 28 * 4 * 128 * 2 * 2),
        (GEMMA_7B, "bf16", 28 * 16 * 256 * 2 * 2),
        (LLAMA3_8B, "float32", 262_144),
    ],
)
def test_kv_bytes_per_token_from_config(config, dtype, expected):
    assert memory.kv_bytes_per_token(config, dtype) == expected


def test_mqa_has_one_kv_head():
    cfg = dict(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, hidden_size=512)
    assert memory.kv_bytes_per_token(cfg, "fp16") == 2 * 1 * 64 * 2 * 2


def test_reads_transformers_config_objects_and_torch_dtypes():
    import torch
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096
    )
    assert memory.kv_bytes_per_token(cfg, torch.bfloat16) == 131_072


def test_blocks_and_concurrency():
    per_block = memory.block_bytes(LLAMA3_8B, "bf16", 16)
    assert per_block == 131_072 * 16
    assert memory.num_blocks_in_budget(10 * per_block + per_block - 1, LLAMA3_8B, "bf16", 16) == 10
    assert memory.blocks_for_tokens(1, 16) == 1
    assert memory.blocks_for_tokens(16, 16) == 1
    assert memory.blocks_for_tokens(17, 16) == 2
    # 720-token average sequences (600 in + 120 out) take 45 blocks of 16 tokens each.
    assert memory.max_concurrency(450, 720, 16) == 10
    assert memory.max_concurrency(449, 720, 16) == 9


def test_split_memory_caps_kv_region_in_whole_blocks():
    gib = 2**30
    split = memory.split_memory(80 * gib, 16 * gib, 4 * gib, 0.9, LLAMA3_8B, "bf16", 16)
    per_block = memory.block_bytes(LLAMA3_8B, "bf16", 16)
    assert split.kv_region_bytes == split.num_blocks * per_block
    assert split.kv_region_bytes <= 0.9 * 80 * gib - 20 * gib
    assert 0.9 * 80 * gib - 20 * gib - split.kv_region_bytes < per_block


def test_model_that_does_not_fit_says_by_how_much_and_what_to_change():
    gib = 2**30
    with pytest.raises(ValueError, match=r"short by 2\.\d+ GiB.*larger device, a smaller dtype"):
        memory.split_memory(16 * gib, 14 * gib, 4 * gib, 1.0, LLAMA2_7B, "fp16", 16)


def test_bad_dtype_and_sizes_are_named():
    with pytest.raises(ValueError, match="dtype='int3'"):
        memory.dtype_bytes("int3")
    with pytest.raises(ValueError, match="block_size_tokens=0"):
        memory.block_bytes(LLAMA2_7B, "fp16", 0)


def test_param_estimate_close_to_real_model():
    from serving.tiny_models import tiny_model

    model = tiny_model("qwen2")
    real = sum(p.numel() for p in model.parameters())
    assert memory.estimate_num_params(model.config) == pytest.approx(real, rel=0.05)


def test_engine_allocates_exactly_what_the_formula_says():
    from serving.engine import EngineConfig, LLMEngine
    from serving.tiny_models import tiny_model

    for arch in ("llama", "qwen2"):
        model = tiny_model(arch)
        engine = LLMEngine(
            model, config=EngineConfig(kv_cache_bytes=3_000_000, block_size_tokens=8)
        )
        per_block = memory.block_bytes(model.config, model.dtype, 8)
        assert engine.pool.num_blocks == 3_000_000 // per_block
        kv = engine.kv_cache
        # + the NULL block, which trimmed sliding-window entries point at (kv_blocks.py)
        assert kv.numel() * kv.element_size() == (engine.pool.num_blocks + 1) * per_block
