"""Paged attention behind transformers' attention interface (decision 1, docs/design.md).

The model runs one packed forward per step: input_ids [1, T] with every scheduled token of every
sequence, decodes first. Our function receives query/key/value [1, heads, T, head_dim] after the
rotary embedding, writes the new K/V into the paged cache, and attends:

  rows 0 .. num_decodes-1   one query each; decodes of similar context length form a group,
                            one SDPA call a group over its gathered blocks (less padding)
  then one segment a prefill  its chunk's queries over its context; causal with an offset

Cache layout, per layer: [2 (K, V), kv_heads, num_blocks, block_size, head_dim].
  - writing: the flat view [2, kv_heads, num_blocks * block_size, head_dim] takes the model's
    key[0] ([kv_heads, T, head_dim]) as is, at slot = table[p // block_size] * block_size + p % bs;
  - reading: index_select of whole blocks on dim 2 copies block_size * head_dim contiguous values
    per index (3x faster than gathering slots on CPU) and leaves [2, kv_heads, B, L, head_dim]
    contiguous, the layout SDPA is fastest on;
  - grouped-query heads are folded, not repeated: query heads [kv_heads x group] are viewed as
    [kv_heads, B, group] so each KV head serves its group without copying K or V.
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
    context_blocks: torch.Tensor | None = None  # [num_blocks] block ids of the whole context
    mask: torch.Tensor | None = None  # [chunk, num_blocks * block_size] bool, True = may attend


@dataclass(slots=True)
class DecodeGroup:
    start: int  # rows start..end-1 of the packed batch, one query each
    end: int
    blocks: torch.Tensor  # [(end - start) * blocks_per_seq] padded block tables
    mask: torch.Tensor  # [1, end - start, 1, blocks_per_seq * block_size] bool


@dataclass(slots=True)
class PagedMetadata:
    """Everything one step's attention needs, built once per step and shared by all layers."""

    kv_cache: torch.Tensor  # [layers, 2, kv_heads, num_blocks, block_size, head_dim]
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """[2, kv_heads, num_blocks, bs, D] -> [2, kv_heads, num_seqs, L, D] for the given blocks."""
    two, kv_heads, _, _, dim = cache.shape
    return cache.index_select(2, blocks).view(two, kv_heads, num_seqs, -1, dim)


def _decode(q: torch.Tensor, cache: torch.Tensor, group: DecodeGroup, scale) -> torch.Tensor:
    """q [H, T, D]; the group's rows, one query per sequence -> [B, H, D]."""
    heads, _, dim = q.shape
    b = group.end - group.start
    kv = _gather(cache, group.blocks, b)  # [2, Hkv, B, L, D]
    kv_heads = kv.shape[1]
    qg = q[:, group.start : group.end].reshape(kv_heads, heads // kv_heads, b, dim)
    out = F.scaled_dot_product_attention(
        qg.transpose(1, 2), kv[0], kv[1], attn_mask=group.mask, scale=scale
    )  # [Hkv, B, group, D]
    return out.transpose(0, 1).reshape(b, heads, dim)


def _prefill(q, k, v, cache, seg: PrefillSegment, scale) -> torch.Tensor:
    """One sequence's chunk: q [H, n, D] -> [n, H, D]."""
    qs = q[:, seg.start : seg.end].unsqueeze(0)
    if seg.context_blocks is None:
        ks = k[:, seg.start : seg.end].unsqueeze(0)
        vs = v[:, seg.start : seg.end].unsqueeze(0)
        out = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        kv = _gather(cache, seg.context_blocks, 1)  # [2, Hkv, 1, L, D]
        out = F.scaled_dot_product_attention(
            qs,
            kv[0].transpose(0, 1),
            kv[1].transpose(0, 1),
            attn_mask=seg.mask,
            scale=scale,
            enable_gqa=True,
        )
    return out[0].transpose(0, 1)


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
    cache = paged.kv_cache[module.layer_idx]  # [2, Hkv, num_blocks, bs, D]
    flat = cache.view(2, cache.shape[1], -1, cache.shape[-1])
    q, k, v = query[0], key[0], value[0]  # [H, T, D], [Hkv, T, D], [Hkv, T, D]
    flat[0].index_copy_(1, paged.slot_mapping, k)
    flat[1].index_copy_(1, paged.slot_mapping, v)
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=q.dtype, device=q.device)
    for group in paged.decode_groups:
        out[group.start : group.end] = _decode(q, cache, group, scaling)
    for seg in paged.prefills:
        out[seg.start : seg.end] = _prefill(q, k, v, cache, seg, scaling)
    return out.unsqueeze(0), None  # [1, T, H, D], as transformers' own backends return


def register() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
