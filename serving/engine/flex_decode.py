"""Decode attention that reads the paged cache in place: FlexAttention over block tables (GPU),
and `resolve_decode_attention`, which picks among gather, flex and the CPU kernel
(serving/engine/cpu_attention.py) for the device at engine start.

The gather path (serving/engine/attention.py) copies every block of a decode group into a
contiguous [2, kv_heads, B, L, head_dim] tensor, per layer, per step, then runs SDPA. On a GPU
that copy is as much memory traffic as the attention itself. Here the whole layer cache,
viewed flat as [1, kv_heads, num_blocks * block_size, head_dim], is the key/value of every
row, and a BlockMask tells the kernel which blocks each row reads:

  batch b = decode row b (one query each);  kv block j of row b = its table entry j
  mask_mod(b, h, q, kv) = kv's block is the table entry `logical` of row b (physical_to_logical)
                          and logical * block_size + kv % block_size < the row's length

Compiled (CUDA), the kernel visits only each row's own blocks (`kv_indices`) and the mask only
cuts the last block's tail. Eager (CPU tests), flex_attention evaluates mask_mod on every slot
of the cache, which is why the mask alone must be exact: it is, through physical_to_logical.

The metadata is built once per step and decode group, with tensor ops on the device, and
shared by every layer of the same paging group. Sliding-window layers keep the gather path
(their windowed gather already reads only the window).
"""

from __future__ import annotations

import functools
import logging

import torch

try:  # torch >= 2.5; the engine refuses decode_attention=flex without it
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - older torch
    BlockMask, flex_attention = None, None

log = logging.getLogger(__name__)


def flex_available() -> bool:
    return flex_attention is not None


def resolve_decode_attention(choice: str, device: torch.device, probe=None, native=None) -> str:
    """`decode_attention` of the engine config -> "flex", "native" or "gather" for this device.

    probe() / native() -> None when flex / the CPU kernel works here on the engine's shapes,
    else why not (`probe_flex`, cpu_attention.probe_native). auto takes flex on CUDA and native
    on CPU only when their check passes, and says why when it does not; an explicit choice
    whose check fails is an error naming the reason."""
    if choice == "gather":
        return choice
    if choice == "native" or (choice == "auto" and device.type == "cpu"):
        return _resolve_native(choice, device, native)
    if not flex_available():
        if choice == "auto":
            return "gather"
        raise ValueError(
            f"EngineConfig.decode_attention='flex' needs torch.nn.attention.flex_attention, "
            f"which torch {torch.__version__} lacks; allowed here: 'auto', 'gather'"
        )
    if choice == "auto" and device.type != "cuda":
        return "gather"  # eager flex is dense over the cache: the gather path is faster on CPU
    failure = None if probe is None else probe()
    if failure is None:
        return "flex"
    if choice == "flex":
        raise ValueError(f"EngineConfig.decode_attention='flex' does not work here: {failure}")
    log.warning("decode attention: gather (flex failed its check on %s: %s)", device, failure)
    return "gather"


def _resolve_native(choice: str, device: torch.device, native) -> str:
    if device.type != "cpu":
        failure = f"it is a CPU kernel and the engine runs on {device.type}"
    else:
        failure = "no check given" if native is None else native()
    if failure is None:
        return "native"
    if choice == "native":
        raise ValueError(f"EngineConfig.decode_attention='native' does not work here: {failure}")
    log.info("decode attention: gather (the CPU kernel is not used: %s)", failure)
    return "gather"


def probe_flex(
    device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, bs: int
) -> str | None:
    """Run one decode group through both of the engine's decode paths (attention._decode with
    gather, then with flex) on the engine's shapes; None when they agree, else what went wrong
    (a compile error on this GPU, a wrong answer)."""
    from serving.engine import attention  # attention imports this module

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        cache = torch.randn(2, kv_heads, 4, bs, head_dim, generator=gen).to(device, dtype)
        q = torch.randn(heads, 2, head_dim, generator=gen).to(device, dtype)  # [H, T, D]
        # row 0: blocks [2, 0], one token into the second; row 1: block [3], padded with 0
        blocks = torch.tensor([2, 0, 3, 0], device=device)
        lens = torch.tensor([bs + 1, 1], device=device)
        mask = torch.arange(2 * bs, device=device).unsqueeze(0) < lens.unsqueeze(1)
        group = attention.DecodeGroup(0, 2, blocks, mask.view(1, 2, 1, 2 * bs))
        spec = attention._Spec(scale=None, window=None, softcap=None)
        out = {}
        for path in ("gather", "flex"):
            paged = attention.PagedMetadata(cache, blocks, decode_attention=path)
            out[path] = attention._decode(q, cache, group, spec, paged, blocks).float()
        err = (out["flex"] - out["gather"]).abs().max().item()
        if not err <= 2e-2:
            return f"flex differs from the gather path by {err:.3g}"
    except Exception as exc:  # a kernel that cannot compile here must not take the engine down
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def decode_block_mask(
    blocks: torch.Tensor, lens: torch.Tensor, num_cache_blocks: int, block_size: int
):
    """The BlockMask of one decode group.

    blocks: [rows * blocks_per_row] padded block tables (padding may name any block: it is cut
    by the length); lens: [rows] context lengths, the new token included.
    """
    rows = lens.numel()
    dev = blocks.device
    table = blocks.view(rows, -1).long()
    per_row = table.shape[1]
    used = torch.div(lens + block_size - 1, block_size, rounding_mode="floor").to(torch.int32)
    logical = torch.arange(per_row, device=dev).expand(rows, per_row)
    real = logical < used.unsqueeze(1)
    # physical block -> its index in the row's table, -1 where the row does not own it; a
    # padding entry writes to the extra column, so it never hides a real entry
    p2l = torch.full((rows, num_cache_blocks + 1), -1, dtype=torch.long, device=dev)
    p2l.scatter_(1, torch.where(real, table, num_cache_blocks), logical)
    p2l = p2l[:, :num_cache_blocks]
    lens_long = lens.long()

    def mask_mod(b, h, q_idx, kv_idx):
        lb = p2l[b, kv_idx // block_size]
        return (lb >= 0) & (lb * block_size + kv_idx % block_size < lens_long[b])

    kv_indices = torch.where(real, table, 0).to(torch.int32).view(rows, 1, 1, per_row)
    return BlockMask.from_kv_blocks(
        used.view(rows, 1, 1),
        kv_indices,
        BLOCK_SIZE=(1, block_size),
        mask_mod=mask_mod,
        seq_lengths=(1, num_cache_blocks * block_size),
        compute_q_blocks=False,  # forward only: no transposed (backward) index
    )


@functools.cache
def _compiled_flex():
    """flex_attention compiled, for CUDA: a fused kernel that skips the blocks a row does not
    read. Elsewhere flex runs eagerly (the reference implementation: exact, dense over the
    cache)."""
    return torch.compile(flex_attention, dynamic=True)


def flex_decode(
    q: torch.Tensor,
    layer_cache: torch.Tensor,
    block_mask,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q [B, H, D] (one query a row) over layer_cache [2, Hkv, num_blocks, bs, D] -> [B, H, D]."""
    two, kv_heads, num_blocks, bs, dim = layer_cache.shape
    flat = layer_cache.view(two, 1, kv_heads, num_blocks * bs, dim)
    score_mod = None
    if softcap is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.tanh(score / softcap) * softcap

    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention
    out = fn(
        q.unsqueeze(2),  # [B, H, 1, D]
        flat[0],
        flat[1],
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=kv_heads != q.shape[1],
    )
    return out.squeeze(2)
