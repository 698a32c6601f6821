"""Linear layers with prepacked weights on CPU, and the engine's choice among them
(`cpu_linear`): this project's own kernel (serving/engine/cpu_matmul.py, float32), oneDNN's
blocked layout (float32; bfloat16 on CPUs with native bf16 units), or plain F.linear. Packed
once at load.

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


def resolve(choice: str, device: torch.device, dtype: torch.dtype, probe=None, flags=None) -> str:
    """`cpu_linear` of the engine config -> "native", "onednn" or "off" for this device and
    dtype. auto: the native kernel on CPU in float32 when its check (`probe`, default
    cpu_matmul.probe) passes, else oneDNN where packing gains, else off; an explicit choice
    that cannot run here is a ValueError naming why."""
    if choice == "off":
        return "off"
    native_dtype = device.type == "cpu" and dtype == torch.float32
    if choice == "native" or (choice == "auto" and native_dtype):
        why = (
            f"the kernel runs float32 on CPU, not {str(dtype).removeprefix('torch.')} on "
            f"{device.type}"
            if not native_dtype
            else (probe or _native_probe)()
        )
        if why is None:
            return "native"
        if choice == "native":
            raise ValueError(f"EngineConfig.cpu_linear='native' does not work here: {why}")
        log.info("cpu_linear auto: oneDNN packing, not the native kernel (%s)", why)
    if can_pack(device, dtype, flags):
        return "onednn"
    if choice == "onednn":
        raise ValueError(
            f"EngineConfig.cpu_linear='onednn' does not work here: packing takes float32 (or "
            f"bfloat16 with native bf16 units) on a CPU with oneDNN, not "
            f"{str(dtype).removeprefix('torch.')} on {device.type}"
        )
    return "off"


def _native_probe() -> str | None:
    from serving.engine import cpu_matmul

    return cpu_matmul.probe()


def pack_if_useful(model, choice: str, device: torch.device, dtype: torch.dtype, race=None) -> str:
    """The engine's call: the kind of linear layers `model` now has ("native", "onednn" or
    "off"). auto packs only models with MIN_WEIGHT_BYTES of linear weights or more (and checks
    no kernel for smaller ones), and where both kernels run it times them on up to 48 MiB of the
    model's own weights (`race`, default cpu_matmul.race_onednn) and keeps the faster; an explicit
    kind packs any size."""
    targets = _plain_linears(model)
    if choice == "auto" and _weight_bytes(targets) < MIN_WEIGHT_BYTES:
        return "off"
    kind = resolve(choice, device, dtype)
    if choice == "auto" and kind == "native" and can_pack(device, dtype):
        kind = _faster(race or _native_race, [c.weight for _, _, c in targets])
    return kind if kind != "off" and pack_linears(model, 0, kind) else "off"


def _native_race(weights: list[torch.Tensor]) -> tuple[float, float]:
    from serving.engine import cpu_matmul

    return cpu_matmul.race_onednn(weights)


def _faster(race, weights: list[torch.Tensor]) -> str:
    native_s, onednn_s = race(weights)
    kind = "native" if native_s <= onednn_s else "onednn"
    log.info(
        "cpu_linear auto: %s (16 rows through up to 48 MiB of the model's weights: "
        "native kernel %.1f ms, oneDNN %.1f ms)",
        kind,
        1e3 * native_s,
        1e3 * onednn_s,
    )
    return kind


def _plain_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear
    ]


def _weight_bytes(targets) -> int:
    return sum(c.weight.numel() * c.weight.element_size() for _, _, c in targets)


def pack_linears(
    model: torch.nn.Module, min_weight_bytes: int | None = None, kind: str = "onednn"
) -> int:
    """Replace every plain `nn.Linear` of `model` by a PackedLinear (kind "onednn") or a
    cpu_matmul.NativeLinear ("native"), in place; returns how many (0 when their weights total
    less than `min_weight_bytes`, default MIN_WEIGHT_BYTES).

    Subclasses of nn.Linear (quantized or LoRA layers) are left alone: their forward is theirs."""
    from serving.engine.cpu_matmul import NativeLinear

    if kind not in ("native", "onednn"):
        raise ValueError(f"pack_linears kind={kind!r} must be 'native' or 'onednn'")
    floor = MIN_WEIGHT_BYTES if min_weight_bytes is None else min_weight_bytes
    targets = _plain_linears(model)
    if _weight_bytes(targets) < floor:
        return 0
    layer = NativeLinear if kind == "native" else PackedLinear
    for parent, name, child in targets:
        setattr(parent, name, layer(child))
    if targets:
        log.info("packed %d linear layers for the %s CPU matmul", len(targets), kind)
    return len(targets)
