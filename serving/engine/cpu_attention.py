"""Decode attention on CPU that reads the paged cache in place: a small C kernel, built per machine.

Why: at 16 decode rows on one CPU thread the gather path (copy each group's blocks, then SDPA)
took about a tenth of a SmolLM2-135M step: a copy of every row's K and V per layer, then SDPA's
fixed cost per call. vLLM's CPU backend reads the paged cache in place with its own kernel. This
one (cpu_attention.c) does the same for float32: per (sequence, kv head) the group's query heads
score each cached key once, softmax, weighted values; ~2.5x faster than gather + SDPA on one
layer of that model (benchmarks/engine_embedded.py measures the engine with each path).

Built once per machine with the system's C compiler (serving/engine/native_build.py). No
compiler, a failed build or a failed start-up check: `decode_attention: auto` keeps the gather
path and says why in the log; an explicit `native` is an error naming the reason.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from serving.engine.native_build import NativeKernel

SOURCE = Path(__file__).with_name("cpu_attention.c")
CFLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC")
MAX_GROUP, MAX_DIM, MAX_GROUP_DIM = 64, 512, 8192  # the kernel's fixed buffers (cpu_attention.c)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ERRORS = {1: "unsupported head shape", 2: "a length past its block table", 3: "a bad block id"}


def _bind(lib: ctypes.CDLL):
    fn = lib.tideserve_paged_decode_f32
    fn.argtypes = [_P] * 7 + [_I] * 7 + [ctypes.c_float]
    fn.restype = ctypes.c_int
    return fn


KERNEL = NativeKernel("cpu_attention", SOURCE, CFLAGS, _bind)


def kernel() -> tuple[object | None, str | None]:
    """(the kernel, None) or (None, why not); built or loaded once per process."""
    return KERNEL.get()


def decode(q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, scale):
    """q [B, H, D], cache [2, Hkv, NB, BS, D] (one layer), tables [B, max_blocks], lens [B] ->
    [B, H, D]. float32 CPU tensors; the caller checked the shapes the kernel takes (supports)."""
    fn, why = kernel()
    if fn is None:
        raise RuntimeError(f"CPU decode attention kernel unavailable: {why}")
    q, tables, lens = q.contiguous(), tables.contiguous(), lens.contiguous()
    rows, heads, dim = q.shape
    _, kv_heads, num_blocks, block_size, _ = cache.shape
    out = torch.empty_like(q)
    scratch = torch.empty((heads // kv_heads) * tables.shape[1] * block_size, dtype=q.dtype)
    rc = fn(
        q.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(), tables.data_ptr(),
        lens.data_ptr(), out.data_ptr(), scratch.data_ptr(),
        rows, heads, kv_heads, dim, block_size, num_blocks, tables.shape[1],
        dim**-0.5 if scale is None else scale,
    )  # fmt: skip
    if rc:
        raise RuntimeError(f"CPU decode attention kernel refused its input: {_ERRORS[rc]}")
    return out


def supports(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether the kernel takes this call: float32 on CPU, a contiguous cache, its head shapes."""
    heads, kv_heads, dim = q.shape[0], cache.shape[1], q.shape[-1]
    return (
        q.dtype == torch.float32
        and cache.dtype == torch.float32
        and q.device.type == "cpu"
        and cache.is_contiguous()
        and heads % kv_heads == 0
        and _head_shape_ok(heads, kv_heads, dim)
    )


def _head_shape_ok(heads: int, kv_heads: int, dim: int) -> bool:
    group = heads // kv_heads
    return group <= MAX_GROUP and dim <= MAX_DIM and group * dim <= MAX_GROUP_DIM


def probe_native(
    dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, block_size: int
) -> str | None:
    """None when the kernel serves the engine's shapes here and agrees with the gather path on
    a small decode group (rows of different lengths, padded tables, a block boundary); else why
    not (a float16 cache, no compiler, a wrong answer)."""
    from serving.engine import attention  # attention imports this module

    if dtype != torch.float32:
        return f"the KV cache is {str(dtype).removeprefix('torch.')}; the kernel reads float32"
    if heads % kv_heads or not _head_shape_ok(heads, kv_heads, head_dim):
        return f"{heads} heads over {kv_heads} kv heads of dim {head_dim}: not the kernel's shape"
    fn, why = kernel()
    if fn is None:
        return why
    gen = torch.Generator().manual_seed(0)
    bs = block_size
    cache = torch.randn(2, kv_heads, 4, bs, head_dim, generator=gen)
    q = torch.randn(heads, 2, head_dim, generator=gen)  # [H, T, D]
    blocks = torch.tensor([2, 0, 3, 0])  # row 0: blocks 2, 0 (one token in 0); row 1: block 3
    lens = torch.tensor([bs + 1, 1])
    mask = torch.arange(2 * bs).unsqueeze(0) < lens.unsqueeze(1)
    group = attention.DecodeGroup(0, 2, blocks, mask.view(1, 2, 1, 2 * bs), lens)
    spec = attention._Spec(scale=None, window=None, softcap=None)
    out = {}
    for path in ("gather", "native"):
        paged = attention.PagedMetadata(cache, blocks, decode_attention=path)
        out[path] = attention._decode(q, cache, group, spec, paged, blocks)
    err = (out["native"] - out["gather"]).abs().max().item()
    return None if err <= 1e-4 else f"the kernel differs from the gather path by {err:.3g}"
