"""LoRA adapter slots: their device bytes (R4: one more line of the memory budget, beside the
weights and the KV cache of capacity/memory.py), and how many a replica needs for adapters of a
given count, rank and popularity (slots_per_replica)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capacity.memory import KVShape, dtype_bytes
from capacity.memory import _get as get_field
from capacity.memory import _text as text_config
from common.validate import check_range

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


# --- slots per replica from the adapters' count, rank and popularity ----------------------------


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """LoRA slots one replica needs (engine.max_loras) and what they cost and buy."""

    slots: int  # engine.max_loras
    adapters_per_replica: int  # the busiest replica's share of the adapters
    miss_fraction: float  # predicted share of its adapter requests that load (LRU, Che)
    distinct_running: float  # expected adapters among its running requests at once
    slot_bytes: int | None = None  # device bytes of the slots, when the model config is given


def zipf_popularity(num_adapters: int, exponent: float = 1.0) -> list[float]:
    """Zipf weights of adapters by popularity rank: the k-th most used weighs 1 / k**exponent
    (not normalised; slots_per_replica takes shares of the total)."""
    check_range("zipf_popularity", "num_adapters", num_adapters, 1, None, integer=True)
    check_range("zipf_popularity", "exponent", exponent, 0.0, None)
    return [1.0 / (k + 1) ** exponent for k in range(num_adapters)]


def _che_miss(shares: Sequence[float], slots: int) -> float:
    """LRU miss fraction for independent requests with these shares and `slots` slots (Che's
    approximation: an adapter stays cached for a characteristic time T, chosen so that the
    expected number of cached adapters, sum 1 - exp(-share x T), equals the slots)."""
    if slots >= len(shares):
        return 0.0
    lo, hi = 0.0, 1.0
    while sum(1 - math.exp(-q * hi) for q in shares) < slots:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(1 - math.exp(-q * mid) for q in shares) < slots else (lo, mid)
    return sum(q * math.exp(-q * hi) for q in shares)


def _replica_shares(popularity: Sequence[float], num_replicas: int) -> list[list[float]]:
    """Each replica's adapters' shares of its own adapter traffic. The affinity router homes an
    adapter on one replica by hashing its name (serving/llm/adapter_affinity.py): on average
    each replica gets an even share of the popular adapters, modelled as round-robin by rank."""
    ranked = sorted(popularity, reverse=True)
    parts = [ranked[r::num_replicas] for r in range(num_replicas)]
    return [[p / sum(part) for p in part] for part in parts if part and sum(part) > 0]


def slots_per_replica(
    popularity: Sequence[float],
    num_replicas: int,
    running_per_replica: int,
    max_miss_fraction: float = 0.05,
    config: Any = None,
    dtype: Any = None,
    max_lora_rank: int = 16,
) -> SlotPlan:
    """The LoRA slots per replica for adapters of this popularity (one weight per adapter, any
    scale) served by `num_replicas` replicas each running `running_per_replica` requests at once:
    at least the adapters those running requests use at once (their slots are pinned), and
    enough that LRU misses at most `max_miss_fraction` of adapter requests; never more than the
    busiest replica's adapters. With `config` and `dtype`, the slots' device bytes at
    `max_lora_rank` (lora_slot_bytes)."""
    check_range("slots_per_replica", "num_replicas", num_replicas, 1, None, integer=True)
    check_range("slots_per_replica", "running_per_replica", running_per_replica, 1, None,
                integer=True)  # fmt: skip
    check_range("slots_per_replica", "max_miss_fraction", max_miss_fraction, 0.0, 1.0)
    finite = all(p >= 0 and math.isfinite(p) for p in popularity)
    if not popularity or not finite or sum(popularity) <= 0:
        raise ValueError(
            f"popularity={list(popularity)[:8]!r} must be one finite weight >= 0 per adapter, "
            "not all 0"
        )
    best: SlotPlan | None = None
    for shares in _replica_shares(popularity, num_replicas):
        distinct = sum(1 - (1 - q) ** running_per_replica for q in shares)
        slots = max(1, math.ceil(round(distinct, 9)))
        while slots < len(shares) and _che_miss(shares, slots) > max_miss_fraction:
            slots += 1
        plan = SlotPlan(slots, len(shares), _che_miss(shares, slots), distinct)
        if best is None or (plan.slots, plan.miss_fraction) > (best.slots, best.miss_fraction):
            best = plan
    assert best is not None, "a positive total weight reaches some replica"
    if config is None:
        return best
    nbytes = lora_slot_bytes(config, dtype, best.slots, max_lora_rank)
    return dataclasses.replace(best, slot_bytes=nbytes)
