"""Paged attention behind transformers' attention interface (DESIGN decision 1).

The model runs one packed forward per step: input_ids [1, T] with every scheduled token of every
sequence, decodes first. Our function receives query/key/value [1, heads, T, head_dim] after the
rotary embedding, writes the new K/V into the paged cache, and attends:

  rows 0 .. num_decodes-1   one query each; all decodes in one SDPA call over gathered context
  then one segment a prefill  its chunk's queries over its context; causal with an offset

Cache layout per layer: [num_blocks * block_size, kv_heads, head_dim]; a token at position p of a
sequence lives at slot table[p // block_size] * block_size + p % block_size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "tideserve_paged"


@dataclass(slots=True)
class PrefillSegment:
    start: int  # first row of this chunk in the packed batch
    end: int
    # None when the chunk starts at position 0: attend to this step's keys, plain causal.
    context_slots: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # [chunk, context] bool, True = may attend


@dataclass(slots=True)
class PagedMetadata:
    """Everything one step's attention needs, built once per step and shared by all layers."""

    kv_cache: torch.Tensor  # [layers, 2, slots, kv_heads, head_dim]
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes
    num_decodes: int = 0
    decode_slots: torch.Tensor | None = None  # [B, L] slots of each decode's context
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, L] bool
    prefills: list[PrefillSegment] = field(default_factory=list)


def _sdpa(q, k, v, mask, scale, causal=False):
    """q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; grouped-query heads are expanded here."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged: PagedMetadata | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    if paged is None:
        raise RuntimeError(
            f"attention '{ATTN_IMPLEMENTATION}' needs the engine's `paged` metadata; "
            "run this model through LLMEngine"
        )
    k_cache = paged.kv_cache[module.layer_idx, 0]
    v_cache = paged.kv_cache[module.layer_idx, 1]
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)
    k_cache.index_copy_(0, paged.slot_mapping, k)
    v_cache.index_copy_(0, paged.slot_mapping, v)
    out = torch.empty_like(q)
    b = paged.num_decodes
    if b:
        qd = q[:b].unsqueeze(2)  # [B, H, 1, D]
        kd = k_cache[paged.decode_slots].transpose(1, 2)  # [B, Hkv, L, D]
        vd = v_cache[paged.decode_slots].transpose(1, 2)
        out[:b] = _sdpa(qd, kd, vd, paged.decode_mask, scaling).squeeze(2)
    for seg in paged.prefills:
        qs = q[seg.start : seg.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if seg.context_slots is None:
            ks = k[seg.start : seg.end].transpose(0, 1).unsqueeze(0)
            vs = v[seg.start : seg.end].transpose(0, 1).unsqueeze(0)
            o = _sdpa(qs, ks, vs, None, scaling, causal=True)
        else:
            ks = k_cache[seg.context_slots].transpose(0, 1).unsqueeze(0)
            vs = v_cache[seg.context_slots].transpose(0, 1).unsqueeze(0)
            o = _sdpa(qs, ks, vs, seg.mask, scaling)
        out[seg.start : seg.end] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def register() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
