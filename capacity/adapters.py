"""Device bytes of LoRA adapter slots (R4): one more line of the memory budget, beside the
weights and the KV cache of capacity/memory.py."""

from __future__ import annotations

from typing import Any

from capacity.memory import KVShape, dtype_bytes
from capacity.memory import _get as get_field
from capacity.memory import _text as text_config

# The projections an engine's adapter slots cover (serving/engine/lora/adapter_config.py).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_slot_bytes(config: Any, dtype: Any, max_loras: int, max_lora_rank: int) -> int:
    """Device bytes of an engine's adapter slots: max_loras x max_lora_rank x (in + out) of every
    targeted projection x layers x dtype bytes (A is [in, r], B is [r, out] per slot).

    Allocated once at start, whatever is loaded, so it comes out of the memory budget like the
    weights (serving/engine/lora/manager.py checks its stacks against this byte for byte)."""
    if max_loras <= 0:
        return 0
    shape = KVShape.from_config(config)
    text = text_config(config)
    if not get_field(text, "hidden_size") or not get_field(text, "intermediate_size"):
        raise ValueError(
            "LoRA slots are sized for Llama-style decoders (hidden_size, intermediate_size, "
            f"{', '.join(LORA_TARGETS)}); this config lacks hidden_size or intermediate_size"
        )
    hidden = int(get_field(text, "hidden_size"))
    inter = int(get_field(text, "intermediate_size"))
    q_out = int(get_field(text, "num_attention_heads")) * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    # (in + out) of q, k, v, o, gate, up, down
    per_layer = (hidden + q_out) + 2 * (hidden + kv_out) + (q_out + hidden) + 3 * (hidden + inter)
    return max_loras * max_lora_rank * per_layer * shape.num_layers * dtype_bytes(dtype)
