"""Paged attention behind transformers' attention interface (decision 1, docs/design.md).

The model runs one packed forward per step: input_ids [1, T] with every scheduled token of every
sequence, decodes first. Our function receives query/key/value [1, heads, T, head_dim] after the
rotary embedding, writes the new K/V into the paged cache, and attends:

  rows 0 .. num_decodes-1   one query each; decodes of similar context length form a group,
                            one SDPA call a group over its gathered blocks (less padding), or
                            on CPU the group through serving/engine/cpu_attention.py's kernel,
                            which reads the blocks in place
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

from capacity.memory import paging_layout
from serving.engine import cpu_attention, flex_decode
from serving.engine.features import UnsupportedModelError, check_attention_kwargs, model_name
from serving.engine.kv_cache import GroupedKVCache

ATTN_IMPLEMENTATION = "tideserve_paged"


@dataclass(slots=True)
class PrefillSegment:
    start: int  # first row of this chunk in the packed batch
    end: int
    # None when the chunk starts at position 0: attend to this step's keys, plain causal.
    context_blocks: torch.Tensor | None = None  # [num_blocks] block ids of the whole context
    mask: torch.Tensor | None = None  # [chunk, num_blocks * block_size] bool, True = may attend
    first_position: int = 0  # the chunk's first token position (host-side: no device read)


@dataclass(slots=True)
class DecodeGroup:
    start: int  # rows start..end-1 of the packed batch, one query each
    end: int
    blocks: torch.Tensor  # [(end - start) * blocks_per_seq] padded block tables
    mask: torch.Tensor  # [1, end - start, 1, blocks_per_seq * block_size] bool
    lens: torch.Tensor | None = None  # [end - start] context lengths (None: from the mask)


@dataclass(slots=True)
class PagedMetadata:
    """Everything one step's attention needs, built once per step and shared by all layers."""

    kv_cache: torch.Tensor | GroupedKVCache  # [layers, 2, kv_heads, blocks + 1, bs, head_dim]
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    # Masks derived once per step and shared by the layers that need them (sliding windows).
    derived: dict = field(default_factory=dict)
    # "gather": copy each decode group's blocks, then SDPA; "flex": FlexAttention reads the
    # cache in place through a block mask (serving/engine/flex_decode.py); "native": the CPU
    # kernel reads it in place (serving/engine/cpu_attention.py)
    decode_attention: str = "gather"


@dataclass(frozen=True, slots=True)
class _Spec:
    """One layer's attention: scale, sliding window (tokens) and logit soft-cap, as passed."""

    scale: float | None
    window: int | None
    softcap: float | None


def _attend(q, k, v, mask, spec: _Spec, is_causal: bool = False, gqa: bool = False):
    """SDPA, or the same math with soft-capped logits, which SDPA cannot do.

    q [A, B, m, D], k/v [A, Bk, L, D], mask broadcastable to [A, B, m, L] (True = attend).
    gqa: q holds H = Hkv x group heads on dim 1 against Hkv key heads (A = 1).
    """
    if spec.softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=spec.scale, enable_gqa=gqa
        )
    shape = q.shape
    if gqa:  # fold [1, H, m, D] -> [Hkv, group, m, D] against [Hkv, 1, L, D]
        q = q.view(k.shape[1], -1, shape[2], shape[3])
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    scale = spec.scale if spec.scale is not None else shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / spec.softcap) * spec.softcap
    if is_causal:
        m, n = scores.shape[-2:]
        mask = torch.ones(m, n, dtype=torch.bool, device=q.device).tril(n - m)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).view(shape)


def _windowed(paged: PagedMetadata, key, mask: torch.Tensor, window: int) -> torch.Tensor:
    """`mask` (causal, key index = position) and-ed with the sliding window; once per step."""
    cached = paged.derived.get((key, window))
    if cached is None:
        kpos = torch.arange(mask.shape[-1], device=mask.device)
        qpos = mask.sum(-1, keepdim=True) - 1  # a causal row's last visible key is its query
        cached = mask & (kpos > qpos - window)
        paged.derived[(key, window)] = cached
    return cached


def _gather(cache: torch.Tensor, blocks: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """[2, kv_heads, num_blocks, bs, D] -> [2, kv_heads, num_seqs, L, D] for the given blocks."""
    two, kv_heads, _, _, dim = cache.shape
    return cache.index_select(2, blocks).view(two, kv_heads, num_seqs, -1, dim)


def _decode_window(paged: PagedMetadata, group: DecodeGroup, window: int, bs: int):
    """(index into the group's flat blocks, mask) covering only each row's window; per step.

    Row b of length n sees positions n-w .. n-1, inside blocks (n-w)//bs .. (n-1)//bs: at most
    (w-1)//bs + 2 of them, however long the sequence, instead of all of its table."""
    key = ("decode-window", group.start, window)
    if key not in paged.derived:
        rows = group.end - group.start
        num_blocks = group.blocks.numel() // rows
        width = min(num_blocks, (window - 1) // bs + 2)
        lens = group.mask.sum(-1).view(rows, 1)  # [B, 1]
        first = torch.clamp((lens - window) // bs, min=0)
        cols = first + torch.arange(width, device=lens.device)  # [B, width] table entries
        row0 = torch.arange(rows, device=lens.device).unsqueeze(1) * num_blocks
        index = (row0 + cols.clamp(max=num_blocks - 1)).view(-1)
        kpos = (first * bs + torch.arange(width * bs, device=lens.device)).view(rows, -1)
        mask = (kpos < lens) & (kpos >= lens - window)  # a clamped duplicate lies past lens
        paged.derived[key] = (index, mask.view(1, rows, 1, width * bs))
    return paged.derived[key]


def _flex(q, cache, group: DecodeGroup, spec: _Spec, paged, blocks) -> torch.Tensor:
    """The group's rows through FlexAttention over the cache in place -> [B, H, D]."""
    key = ("flex", group.start, blocks.data_ptr())  # one mask per group and paging group
    block_mask = paged.derived.get(key)
    if block_mask is None:
        lens = group.mask.sum(-1).view(-1)
        block_mask = flex_decode.decode_block_mask(blocks, lens, cache.shape[2], cache.shape[3])
        paged.derived[key] = block_mask
    qg = q[:, group.start : group.end].transpose(0, 1)  # [B, H, D]
    return flex_decode.flex_decode(qg, cache, block_mask, spec.scale, spec.softcap)


def _decode(q, cache, group: DecodeGroup, spec: _Spec, paged, blocks) -> torch.Tensor:
    """q [H, T, D]; the group's rows, one query per sequence -> [B, H, D]."""
    if paged.decode_attention == "flex" and spec.window is None:
        return _flex(q, cache, group, spec, paged, blocks)
    if (
        paged.decode_attention == "native"
        and spec.window is None
        and spec.softcap is None
        and cpu_attention.supports(q, cache)
    ):
        rows = group.end - group.start
        lens = group.lens if group.lens is not None else group.mask.sum(-1).view(-1)
        qg = q[:, group.start : group.end].transpose(0, 1)  # [B, H, D]
        return cpu_attention.decode(qg, cache, blocks.view(rows, -1), lens, spec.scale)
    heads, _, dim = q.shape
    b = group.end - group.start
    mask = group.mask
    if spec.window is not None:
        index, mask = _decode_window(paged, group, spec.window, cache.shape[3])
        blocks = blocks[index]
    kv = _gather(cache, blocks, b)  # [2, Hkv, B, L, D]
    kv_heads = kv.shape[1]
    qg = q[:, group.start : group.end].reshape(kv_heads, heads // kv_heads, b, dim)
    out = _attend(qg.transpose(1, 2), kv[0], kv[1], mask, spec)  # [Hkv, B, group, D]
    return out.transpose(0, 1).reshape(b, heads, dim)


def _prefill_window(paged: PagedMetadata, seg: PrefillSegment, window: int, bs: int):
    """(first table entry, mask) of a chunk's context that its window can see; per step."""
    key = ("prefill-window", seg.start, window)
    if key not in paged.derived:
        first_query = seg.first_position
        first = max(0, first_query - window + 1) // bs
        mask = _windowed(paged, ("prefill", seg.start), seg.mask, window)[:, first * bs :]
        paged.derived[key] = (first, mask)
    return paged.derived[key]


def _prefill(q, k, v, cache, seg: PrefillSegment, spec: _Spec, paged, blocks) -> torch.Tensor:
    """One sequence's chunk: q [H, n, D] -> [n, H, D]."""
    qs = q[:, seg.start : seg.end].unsqueeze(0)
    n = seg.end - seg.start
    if seg.context_blocks is None:
        ks = k[:, seg.start : seg.end].unsqueeze(0)
        vs = v[:, seg.start : seg.end].unsqueeze(0)
        if spec.window is None or spec.window >= n:
            out = _attend(qs, ks, vs, None, spec, is_causal=True, gqa=True)
        else:
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            mask = _windowed(paged, ("prefill", seg.start), causal, spec.window)
            out = _attend(qs, ks, vs, mask, spec, gqa=True)
    else:
        mask = seg.mask
        if spec.window is not None:  # skip the blocks wholly before the window
            first, mask = _prefill_window(paged, seg, spec.window, cache.shape[3])
            blocks = blocks[first:]
        kv = _gather(cache, blocks, 1)  # [2, Hkv, 1, L, D]
        out = _attend(qs, kv[0].transpose(0, 1), kv[1].transpose(0, 1), mask, spec, gqa=True)
    return out[0].transpose(0, 1)


def _owner(module) -> str:
    return f"{type(module).__name__} of model {model_name(getattr(module, 'config', {}))}"


def _spec(module, scaling, dropout, sliding_window, softcap, kwargs) -> _Spec:
    """Validate what the model passed; anything not implemented is refused by name."""
    check_attention_kwargs(module, kwargs)
    if dropout:
        raise UnsupportedModelError(
            f"{_owner(module)} asks for attention dropout={dropout}; the engine serves models "
            "in eval mode only"
        )
    if sliding_window is not None and sliding_window < 1:
        raise UnsupportedModelError(f"sliding_window={sliding_window} must be >= 1")
    return _Spec(scaling, sliding_window, softcap)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged: PagedMetadata | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    if paged is None:
        raise RuntimeError(
            f"attention '{ATTN_IMPLEMENTATION}' needs the engine's `paged` metadata; "
            "run this model through LLMEngine"
        )
    if attention_mask is not None:  # the masking is ours; a model-made mask would be ignored
        raise UnsupportedModelError(
            f"{_owner(module)} passes its own attention mask, which the paged attention would "
            "ignore"
        )
    spec = _spec(module, scaling, dropout, sliding_window, softcap, kwargs)
    layer = module.layer_idx
    _check_window(module, layer, spec)
    out = attend(paged, layer, spec, query[0], key[0], value[0])
    return out.unsqueeze(0), None  # [1, T, H, D], as transformers' own backends return


def attend(paged: PagedMetadata, layer: int, spec: _Spec, q, k, v) -> torch.Tensor:
    """Write this step's K/V of `layer` into the cache, then attend: q [H, T, D], k and v
    [Hkv, T, D] (views of any strides) -> [T, H, D]. The model's own forward reaches it
    through paged_attention_forward, the lean forward (serving/engine/lean_forward.py) directly."""
    cache = paged.kv_cache[layer]  # [2, Hkv, num_blocks + 1, bs, D]
    slots, decode_blocks, prefill_blocks = _group_blocks(paged, layer)
    flat = cache.view(2, cache.shape[1], -1, cache.shape[-1])
    flat[0].index_copy_(1, slots, k)
    flat[1].index_copy_(1, slots, v)
    out = torch.empty(q.shape[1], q.shape[0], q.shape[2], dtype=q.dtype, device=q.device)
    for group, blocks in zip(paged.decode_groups, decode_blocks, strict=True):
        out[group.start : group.end] = _decode(q, cache, group, spec, paged, blocks)
    for seg, blocks in zip(paged.prefills, prefill_blocks, strict=True):
        out[seg.start : seg.end] = _prefill(q, k, v, cache, seg, spec, paged, blocks)
    return out


def _group_blocks(paged: PagedMetadata, layer: int):
    """(slot mapping, decode groups' blocks, prefills' context blocks) in `layer`'s own paging
    group: the runner's ids for group 0, translated once per step for the others."""
    kv = paged.kv_cache
    group = kv.group_of(layer) if isinstance(kv, GroupedKVCache) else 0
    cached = paged.derived.get(("group", group))
    if cached is not None:
        return cached
    slots = paged.slot_mapping
    decode = [g.blocks for g in paged.decode_groups]
    prefill = [s.context_blocks for s in paged.prefills]
    if group:
        page_map = kv.page_map(group)
        slots = kv.translate_slots(group, slots, page_map)
        decode = [kv.translate_blocks(group, b, page_map) for b in decode]
        prefill = [None if b is None else kv.translate_blocks(group, b, page_map) for b in prefill]
    paged.derived[("group", group)] = cached = (slots, decode, prefill)
    return cached


def _check_window(module, layer: int, spec: _Spec) -> None:
    """A layer whose paging group frees blocks outside window W must attend within W."""
    freed_outside = getattr(module, "_tideserve_paging_window", False)
    if freed_outside is False:  # once per module: the layout is a function of the config
        layout = paging_layout(module.config)
        freed_outside = layout.group_windows[layout.layer_group[layer]]
        module._tideserve_paging_window = freed_outside
    if freed_outside is not None and (spec.window is None or spec.window > freed_outside):
        raise RuntimeError(
            f"{_owner(module)} layer {layer} attends with sliding_window={spec.window} but its "
            f"paging group frees blocks outside a {freed_outside}-token window"
        )


def register() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
