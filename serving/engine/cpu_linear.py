"""Linear layers with prepacked weights on CPU: oneDNN's blocked layout, packed once at load
(float32; bfloat16 on CPUs with native bf16 units).

Why: a decode step multiplies a few rows (one per running sequence) by every weight matrix.
`torch.nn.functional.linear` on CPU hands the weight to sgemm in its stored [out, in] layout,
and the BLAS re-packs it on every call; with a few rows that re-packing is a large share of
the step. benchmarks/engine_embedded.py measures the engine with and without it in one run
(SmolLM2-135M, 16 streams, this project's 2-vCPU AVX2 machine: 1.25x). vLLM's CPU backend does
the same with its oneDNN matmul handles; PyTorch's inductor does it under `freezing`.

The packed copy replaces the module (the [out, in] weight is dropped), except where the weight
is shared with another module (a tied LM head): that one keeps its original for the embedding.
Results differ from `F.linear` only in summation order (about 1e-6 relative in float32).
"""

from __future__ import annotations

import logging

import torch

from serving.engine import dtypes

log = logging.getLogger(__name__)

# Dtypes whose packed matmul was measured faster than F.linear. bfloat16 only where the CPU has
# native bf16 dot products (the flags `dtype: auto` reads, serving/engine/dtypes.py): on an AMD
# EPYC with AVX512-BF16, SmolLM2's shapes at 1-16 rows ran 1.2-2.4x faster packed (the LM head
# 1.67x at 16 rows), and the engine 1.2-1.5x; elsewhere PyTorch emulates bf16 and this was not
# measured, so it stays off.
PACKED_DTYPES = (torch.float32,)
NATIVE_BF16_DTYPES = (torch.bfloat16,)

# Below this many bytes of linear weights the whole model stays in the CPU's caches, the BLAS
# packs from cache cheaply, and oneDNN's fixed cost per call (tens of microseconds) loses: by hand
# on this machine, a cache-resident 256x688 projection at 1 row took 35 us with F.linear and 73 us
# packed. Above it the weights stream from DRAM every step and packing once wins.
MIN_WEIGHT_BYTES = 64 * 2**20


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W held in oneDNN's layout; any number of leading dims, any row count."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        # Buffers, not parameters: they never train, and `model.parameters()` keeps naming the
        # model's real dtype and device from its remaining (embedding, norm) tensors.
        self.register_buffer("packed_weight", packed, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed_weight, self.bias, "none", [], ""
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"


def can_pack(
    device: torch.device, dtype: torch.dtype, cpu_flags: frozenset[str] | None = None
) -> bool:
    """Whether packing gains here; `cpu_flags` (this machine's when None) decide for bfloat16."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype in NATIVE_BF16_DTYPES:
        return dtypes.cpu_runs_bf16_fast(
            dtypes.read_cpu_flags() if cpu_flags is None else cpu_flags
        )
    return dtype in PACKED_DTYPES


def pack_if_useful(model, enabled: bool, device: torch.device, dtype: torch.dtype) -> int:
    """The engine's call: pack when the config allows it and the device and dtype gain."""
    return pack_linears(model) if enabled and can_pack(device, dtype) else 0


def pack_linears(model: torch.nn.Module, min_weight_bytes: int | None = None) -> int:
    """Replace every plain `nn.Linear` of `model` by a PackedLinear, in place; returns how many
    (0 when their weights total less than `min_weight_bytes`, default MIN_WEIGHT_BYTES).

    Subclasses of nn.Linear (quantized or LoRA layers) are left alone: their forward is theirs."""
    floor = MIN_WEIGHT_BYTES if min_weight_bytes is None else min_weight_bytes
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear
    ]
    weight_bytes = sum(c.weight.numel() * c.weight.element_size() for _, _, c in targets)
    if weight_bytes < floor:
        return 0
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    if targets:
        log.info("packed %d linear layers into oneDNN's layout (CPU)", len(targets))
    return len(targets)
