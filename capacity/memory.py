"""The one memory formula (R4, docs/requirements.md). Every size in the project is computed here.

    device memory = weights + KV bytes per token x average sequence length x concurrency + reserve

KV bytes per token = layers x KV heads x head dim x 2 (K and V) x dtype bytes. The engine allocates
its paged cache from these numbers, the planner prints them, and a test checks that the two agree
byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a name ("bf16") or a torch dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclass(frozen=True, slots=True)
class KVShape:
    """What of a model's shape the KV cache depends on."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Any) -> KVShape:
        """Read a transformers config (object or dict); GQA/MQA aware, explicit head_dim first."""
        text = _get(config, "text_config")
        if text is not None:  # multimodal wrappers keep the decoder's shape one level down
            config = text
        num_layers = _get(config, "num_hidden_layers", _get(config, "n_layer"))
        num_heads = _get(config, "num_attention_heads", _get(config, "n_head"))
        hidden = _get(config, "hidden_size", _get(config, "n_embd"))
        if num_layers is None or num_heads is None:
            raise ValueError("config lacks num_hidden_layers / num_attention_heads")
        kv_heads = _get(config, "num_key_value_heads") or num_heads
        head_dim = _get(config, "head_dim")
        if not head_dim:
            if hidden is None:
                raise ValueError("config has neither head_dim nor hidden_size")
            head_dim = hidden // num_heads
        return cls(int(num_layers), int(kv_heads), int(head_dim))


def kv_bytes_per_token(config: Any, dtype: Any) -> int:
    """layers x KV heads x head dim x 2 (K and V) x dtype bytes."""
    shape = config if isinstance(config, KVShape) else KVShape.from_config(config)
    return shape.num_layers * shape.num_kv_heads * shape.head_dim * 2 * dtype_bytes(dtype)


def block_bytes(config: Any, dtype: Any, block_size_tokens: int) -> int:
    """Bytes of one KV block of `block_size_tokens` tokens, all layers, K and V."""
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens={block_size_tokens} must be >= 1")
    return kv_bytes_per_token(config, dtype) * block_size_tokens


def num_blocks_in_budget(
    kv_budget_bytes: int, config: Any, dtype: Any, block_size_tokens: int
) -> int:
    """Whole blocks that fit in a KV budget (the hard cap on the KV region)."""
    if kv_budget_bytes < 0:
        raise ValueError(f"kv_budget_bytes={kv_budget_bytes} must be >= 0")
    return kv_budget_bytes // block_bytes(config, dtype, block_size_tokens)


def blocks_for_tokens(num_tokens: int, block_size_tokens: int) -> int:
    """Blocks one sequence of `num_tokens` tokens occupies (its last block may be partly used)."""
    return -(-num_tokens // block_size_tokens)


def max_concurrency(num_blocks: int, avg_seq_len_tokens: float, block_size_tokens: int) -> int:
    """Sequences of the average length that fit in `num_blocks` (R4: derive, then enforce)."""
    if avg_seq_len_tokens <= 0:
        raise ValueError(f"avg_seq_len_tokens={avg_seq_len_tokens} must be > 0")
    per_seq = blocks_for_tokens(math.ceil(avg_seq_len_tokens), block_size_tokens)
    return num_blocks // per_seq


def weight_bytes(num_params: int, dtype: Any) -> int:
    return num_params * dtype_bytes(dtype)


def estimate_num_params(config: Any) -> int:
    """Parameters of a decoder-only transformer from its config alone (no weights read).

    Embedding + per layer (attention projections + gated or plain MLP + norms) + untied LM head.
    Accurate to within a few percent for Llama/Mistral/Qwen-style models; MoE is not modelled.
    """
    shape = KVShape.from_config(config)
    text = _get(config, "text_config") or config
    hidden = int(_get(text, "hidden_size", _get(text, "n_embd")))
    vocab = int(_get(text, "vocab_size"))
    heads = int(_get(text, "num_attention_heads", _get(text, "n_head")))
    inter = _get(text, "intermediate_size", _get(text, "n_inner")) or 4 * hidden
    gated = _get(text, "hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh") and _get(
        text, "model_type", "llama"
    ) not in ("gpt2",)
    q_out = heads * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    mlp = (3 if gated else 2) * hidden * int(inter)
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden
    tied = bool(_get(text, "tie_word_embeddings", _get(config, "tie_word_embeddings", False)))
    return embed + shape.num_layers * per_layer + hidden + (0 if tied else embed)


@dataclass(frozen=True, slots=True)
class MemorySplit:
    """How device memory divides (R4). All fields in bytes except where named otherwise."""

    device_bytes: int
    weight_bytes: int
    reserve_bytes: int
    kv_region_bytes: int
    kv_bytes_per_token: int
    block_size_tokens: int
    num_blocks: int

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size_tokens


def split_memory(
    device_bytes: int,
    weights_bytes: int,
    reserve_bytes: int,
    utilization: float,
    config: Any,
    dtype: Any,
    block_size_tokens: int,
) -> MemorySplit:
    """KV region = utilization x device - weights - reserve, rounded down to whole blocks.

    Raises a ValueError saying how many GiB are missing and what to change when nothing is left.
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization={utilization} must be in (0, 1]")
    usable = int(device_bytes * utilization)
    kv_region = usable - weights_bytes - reserve_bytes
    per_block = block_bytes(config, dtype, block_size_tokens)
    if kv_region < per_block:
        short_gib = (per_block - kv_region) / 2**30
        raise ValueError(
            f"model does not fit: {utilization:.0%} of {device_bytes / 2**30:.1f} GiB leaves "
            f"{kv_region / 2**30:.2f} GiB for the KV cache after "
            f"{weights_bytes / 2**30:.2f} GiB of weights and {reserve_bytes / 2**30:.2f} GiB of "
            f"reserve; short by {short_gib:.2f} GiB. "
            "Use a larger device, a smaller dtype, or raise utilization."
        )
    num_blocks = kv_region // per_block
    return MemorySplit(
        device_bytes=device_bytes,
        weight_bytes=weights_bytes,
        reserve_bytes=reserve_bytes,
        kv_region_bytes=num_blocks * per_block,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype),
        block_size_tokens=block_size_tokens,
        num_blocks=num_blocks,
    )
