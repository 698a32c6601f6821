"""The one memory formula (R4, docs/requirements.md). Every size in the project is computed here.

    device memory = weights + KV bytes per token x average sequence length x concurrency + reserve

KV bytes per token = layers x KV heads x head dim x 2 (K and V) x dtype bytes; with latent
attention (DeepSeek MLA) a layer caches one latent of kv_lora_rank + qk_rope_head_dim values
instead. A sliding-window layer holds at most its window of tokens, so a sequence longer than
the window costs less than length x bytes per token (`seq_kv_bytes`). Weights count every
parameter (capacity.params: exact, from the config), at the bits of their quantisation.

The engine pages KV in blocks of `block_size_tokens`; `paging_layout` says how (layers that share
a window share pages), `block_bytes` what one page costs and `seq_blocks` how many pages a
sequence holds. The engine allocates its cache from these numbers, the planner prints them, and
tests check that the two agree byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Any

from capacity.quantization import quantized_bits_per_weight

GIB = 2**30
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
# More groups than this and the per-group bookkeeping outweighs the saving: page every layer
# together and keep all blocks (windows are still applied by the attention mask).
MAX_PAGING_GROUPS = 8


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


def _text(config: Any) -> Any:
    text = _get(config, "text_config")
    return config if text is None else text  # multimodal wrappers keep the decoder one level down


def _layer_windows(config: Any, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window in tokens (None: sees the whole sequence).

    `layer_types` when the config has it (transformers derives it for Qwen2/3, Gemma 2/3...);
    a raw config.json may lack it, so the same rules are read here for Gemma 2 (even layers
    slide), Gemma 3 (all but every sliding_window_pattern-th) and Qwen (layers >=
    max_window_layers slide, only with use_sliding_window); any other window covers every layer.
    """
    window = _get(config, "sliding_window")
    types = _get(config, "layer_types")
    if types:
        return tuple(window if t == "sliding_attention" else None for t in types)
    kind = _get(config, "model_type", "")
    if not window or _get(config, "use_sliding_window") is False:
        return (None,) * num_layers
    if kind == "gemma2":
        return tuple(window if (i + 1) % 2 else None for i in range(num_layers))
    if kind in ("gemma3", "gemma3_text"):
        pattern = _get(config, "sliding_window_pattern", 6)
        return tuple(window if (i + 1) % pattern else None for i in range(num_layers))
    if _get(config, "use_sliding_window"):
        first = _get(config, "max_window_layers", 0)
        return tuple(window if i >= first else None for i in range(num_layers))
    return (window,) * num_layers


@dataclass(frozen=True, slots=True)
class KVShape:
    """What of a model's shape the KV cache depends on."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int | None, ...] = ()  # per layer; () = every layer sees everything
    latent_dim: int | None = None  # latent attention: one shared K/V latent per token and layer

    @classmethod
    def from_config(cls, config: Any) -> KVShape:
        """Read a transformers config (object or dict); GQA/MQA aware, explicit head_dim first."""
        config = _text(config)
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
        latent = None
        if _get(config, "kv_lora_rank"):
            latent = int(_get(config, "kv_lora_rank")) + int(_get(config, "qk_rope_head_dim", 0))
        windows = _layer_windows(config, int(num_layers))
        return cls(
            int(num_layers),
            int(kv_heads),
            int(head_dim),
            windows if any(windows) else (),
            latent,
        )

    @property
    def elems_per_token_layer(self) -> int:
        """Values one layer caches per token: K and V heads, or the one latent."""
        return self.latent_dim or 2 * self.num_kv_heads * self.head_dim

    @property
    def windows(self) -> tuple[int | None, ...]:
        return self.layer_windows or (None,) * self.num_layers


def _shape(config: Any) -> KVShape:
    return config if isinstance(config, KVShape) else KVShape.from_config(config)


def kv_bytes_per_token(config: Any, dtype: Any) -> int:
    """layers x KV heads x head dim x 2 (K and V) x dtype bytes (MLA: layers x latent x bytes).

    Every layer counts: this is what one token costs while it is inside every window."""
    shape = _shape(config)
    return shape.num_layers * shape.elems_per_token_layer * dtype_bytes(dtype)


def seq_kv_bytes(config: Any, dtype: Any, num_tokens: int) -> int:
    """KV of one sequence of `num_tokens`, each sliding layer bounded by its window."""
    shape = _shape(config)
    per_layer = shape.elems_per_token_layer * dtype_bytes(dtype)
    return sum(per_layer * (num_tokens if w is None else min(num_tokens, w)) for w in shape.windows)


# --- paging: what the engine allocates -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PagingLayout:
    """How the engine pages KV: groups of equally many layers, one window per group.

    A page (block) holds `layers_per_group` layers' K and V for block_size tokens; every group
    draws its pages from one pool, so a page freed by a sliding group serves any group. Group 0
    has the largest window (None = full) and its block tables are the ones the runner reads;
    layer l lives in group layer_group[l] at index layer_slot[l] of the cache tensor.
    """

    group_windows: tuple[int | None, ...]
    layers_per_group: int
    layer_group: tuple[int, ...]
    layer_slot: tuple[int, ...]

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)


def paging_layout(config: Any, max_groups: int = MAX_PAGING_GROUPS) -> PagingLayout:
    """Layers grouped by window: gcd-sized groups so every group's page has the same bytes.

    More than `max_groups` groups (1: an attention backend that reads one table) pages every
    layer together under the widest window (None if any layer is full)."""
    windows = _shape(config).windows
    kinds = sorted(set(windows), key=lambda w: (w is not None, -(w or 0)))  # full first
    counts = [windows.count(w) for w in kinds]
    size = reduce(math.gcd, counts)
    if len(windows) // size > max_groups:
        kinds, size = [None if None in kinds else max(kinds)], len(windows)
    group_windows: list[int | None] = []
    layer_group: list[int] = [0] * len(windows)
    layer_slot: list[int] = [0] * len(windows)
    for kind in kinds:
        members = [i for i, w in enumerate(windows) if w == kind or len(kinds) == 1]
        for start in range(0, len(members), size):
            for slot, layer in enumerate(members[start : start + size]):
                layer_group[layer], layer_slot[layer] = len(group_windows), slot
            group_windows.append(kind)
    return PagingLayout(tuple(group_windows), size, tuple(layer_group), tuple(layer_slot))


def block_bytes(config: Any, dtype: Any, block_size_tokens: int) -> int:
    """Bytes of one KV page: block_size tokens of one paging group's layers, K and V."""
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens={block_size_tokens} must be >= 1")
    shape = _shape(config)
    per_layer = shape.elems_per_token_layer * dtype_bytes(dtype)
    return paging_layout(shape).layers_per_group * per_layer * block_size_tokens


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


def window_blocks(window_tokens: int, block_size_tokens: int, chunk_tokens: int = 1) -> int:
    """Most blocks a sliding layer group holds for one sequence while it runs `chunk_tokens`.

    Queries at c .. c+n-1 see keys from c-w+1: a span of w + n - 1 tokens, which crosses at most
    (w + n - 2) // block_size + 2 blocks; blocks before it are freed."""
    return (window_tokens + chunk_tokens - 2) // block_size_tokens + 2


def seq_blocks(
    group_windows: tuple[int | None, ...],
    num_tokens: int,
    block_size_tokens: int,
    chunk_tokens: int = 1,
) -> int:
    """Pages one sequence of `num_tokens` holds at most, summed over the paging groups
    (PagingLayout.group_windows), while it runs chunks of up to `chunk_tokens`."""
    full = blocks_for_tokens(num_tokens, block_size_tokens)
    return sum(
        full if w is None else min(full, window_blocks(w, block_size_tokens, chunk_tokens))
        for w in group_windows
    )


def max_concurrency(
    num_blocks: int,
    avg_seq_len_tokens: float,
    block_size_tokens: int,
    group_windows: tuple[int | None, ...] = (None,),
) -> int:
    """Sequences of the average length that fit in `num_blocks` (R4: derive, then enforce)."""
    if avg_seq_len_tokens <= 0:
        raise ValueError(f"avg_seq_len_tokens={avg_seq_len_tokens} must be > 0")
    n = math.ceil(avg_seq_len_tokens)
    return num_blocks // seq_blocks(group_windows, n, block_size_tokens)


# --- weights and the memory split ----------------------------------------------------------------


def weight_bytes(params: Any, dtype: Any, quantization: dict | None = None) -> int:
    """Bytes of the weights: `params` (an int, or a capacity.params.ParamCount) at `dtype`.

    With a `quantization_config`, the decoder's linear weights (ParamCount.quantizable) take the
    quantised bits per weight, scales included (capacity.quantization); the rest (embeddings,
    norms, LM head) stays in `dtype`."""
    if isinstance(params, int):
        return params * dtype_bytes(dtype)
    if not quantization:
        return params.total * dtype_bytes(dtype)
    bits = quantized_bits_per_weight(quantization)
    rest = params.total - params.quantizable
    return math.ceil(params.quantizable * bits / 8) + rest * dtype_bytes(dtype)


def default_reserve_bytes(device_bytes: int) -> int:
    """2 GiB + 5 % of device memory, held outside weights and KV.

    The fixed part covers the CUDA context, cuBLAS/NCCL workspaces and the torch runtime (about
    0.5-1.5 GiB on current drivers); the proportional part covers activations of the largest
    prefill batch and the caching allocator's fragmentation, both of which grow with the card.
    """
    return 2 * GIB + int(0.05 * device_bytes)


def estimate_num_params(config: Any) -> int:
    """Parameters of a dense decoder from its shape alone: the fallback of capacity.params for
    architectures transformers does not ship. Embedding + per layer (attention + gated or plain
    MLP + norms) + untied LM head; within a few percent for Llama-style models, no MoE."""
    shape = KVShape.from_config(config)
    text = _text(config)
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
    num_paging_groups: int = 1
    lora_slot_bytes: int = 0  # LoRA adapter slots, allocated at start like the weights

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV region holds for sequences inside every window (all groups paged)."""
        return self.num_blocks * self.block_size_tokens // self.num_paging_groups


def does_not_fit(
    what: str,
    device: str,
    device_bytes: int,
    utilization: float,
    weights_bytes: int,
    reserve_bytes: int,
    need_kv_bytes: int,
) -> str | None:
    """The GiB message when weights + reserve + `need_kv_bytes` exceed the usable memory."""
    usable = int(device_bytes * utilization)
    left = usable - weights_bytes - reserve_bytes
    if left >= need_kv_bytes:
        return None
    return (
        f"{what} does not fit on {device}: {utilization:.0%} of {device_bytes / GIB:.2f} GiB = "
        f"{usable / GIB:.2f} GiB usable; weights {weights_bytes / GIB:.2f} GiB + reserve "
        f"{reserve_bytes / GIB:.2f} GiB leave {left / GIB:.2f} GiB for the KV cache, which needs "
        f"at least {need_kv_bytes / GIB:.2f} GiB; short by {(need_kv_bytes - left) / GIB:.2f} GiB"
    )


def split_memory(
    device_bytes: int,
    weights_bytes: int,
    reserve_bytes: int,
    utilization: float,
    config: Any,
    dtype: Any,
    block_size_tokens: int,
    lora_slot_bytes: int = 0,
) -> MemorySplit:
    """KV region = utilization x device - weights - LoRA slots - reserve, rounded down to whole
    blocks.

    Raises a ValueError saying how many GiB are missing and what to change when nothing is left.
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization={utilization} must be in (0, 1]")
    per_block = block_bytes(config, dtype, block_size_tokens)
    message = does_not_fit(
        "model", "this device", device_bytes, utilization, weights_bytes + lora_slot_bytes,
        reserve_bytes, per_block,
    )  # fmt: skip
    if message is not None:
        raise ValueError(f"{message}. Use a larger device, a smaller dtype, or raise utilization.")
    fixed_bytes = weights_bytes + lora_slot_bytes + reserve_bytes
    num_blocks = (int(device_bytes * utilization) - fixed_bytes) // per_block
    return MemorySplit(
        device_bytes=device_bytes,
        weight_bytes=weights_bytes,
        reserve_bytes=reserve_bytes,
        kv_region_bytes=num_blocks * per_block,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype),
        block_size_tokens=block_size_tokens,
        num_blocks=num_blocks,
        num_paging_groups=paging_layout(config).num_groups,
        lora_slot_bytes=lora_slot_bytes,
    )
