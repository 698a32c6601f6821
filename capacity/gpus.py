"""GPU catalogue for the capacity planner (R6, docs/requirements.md): memory, bandwidth and dense
BF16 compute.

Figures are NVIDIA datasheet values, first quoted from memory, then checked (2026-11-30) against
public spec pages: H100 SXM dense BF16 989.4 TFLOPS and 3.35 TB/s (glennklockwood.com H100 notes),
H100 PCIe > 2,000 GB/s (NVIDIA product brief PB-11133), H200 141 GB and 4.8 TB/s, L40S 48 GB,
864 GB/s and BF16 362 dense / 733 sparse (NVIDIA L40/L40S table), A10G 24 GB and 600 GB/s (Baseten's
A10 vs A10G comparison). The A100, L4 and T4 rows are unchecked quotes. Each entry names its source.
Compute is *dense* (the datasheets print the 2:4-sparse figure too, which is twice as large; the
planner must never use it). Memory is the datasheet's nameplate size taken as GiB; `nvidia-smi`
reports slightly less on some parts (H100 80 GB: 79.6 GiB, L4: 22.5 GiB), a gap the planner's
reserve (2 GiB + 5 %) absorbs. Measured values replace these once a probe exists.
"""

from __future__ import annotations

from dataclasses import dataclass

_GIB = 1024**3
_GB = 10**9
_TFLOP = 10**12


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: int
    bf16_flops_per_s: int  # dense tensor-core BF16 (FP16 where the part has no BF16)
    source: str
    bf16_supported: bool = True


_CATALOGUE: tuple[GpuSpec, ...] = (
    GpuSpec(
        "H200",
        141 * _GIB,
        4_800 * _GB,
        989 * _TFLOP,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM; nvidia.com/en-us/data-center/h200): "
        "141 GB HBM3e, 4.8 TB/s, BF16 1,979 TFLOPS with sparsity -> 989 dense",
    ),
    GpuSpec(
        "H100-SXM",
        80 * _GIB,
        3_350 * _GB,
        989 * _TFLOP,
        "NVIDIA H100 Tensor Core GPU datasheet, SXM column (nvidia.com/en-us/data-center/h100): "
        "80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS with sparsity -> 989 dense",
    ),
    GpuSpec(
        "H100-PCIe",
        80 * _GIB,
        2_000 * _GB,
        756 * _TFLOP,
        "NVIDIA H100 Tensor Core GPU datasheet, PCIe column: 80 GB HBM2e, 2 TB/s, "
        "BF16 1,513 TFLOPS with sparsity -> 756 dense",
    ),
    GpuSpec(
        "A100-40GB",
        40 * _GIB,
        1_555 * _GB,
        312 * _TFLOP,
        "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), A100 40GB "
        "SXM: 1,555 GB/s, BF16 312 TFLOPS dense (624 sparse)",
    ),
    GpuSpec(
        "A100-80GB",
        80 * _GIB,
        2_039 * _GB,
        312 * _TFLOP,
        "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 2,039 GB/s, BF16 312 TFLOPS dense",
    ),
    GpuSpec(
        "L40S",
        48 * _GIB,
        864 * _GB,
        362 * _TFLOP,
        "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): 48 GB GDDR6, 864 GB/s, "
        "BF16 733 TFLOPS with sparsity -> 362 dense",
    ),
    GpuSpec(
        "L4",
        24 * _GIB,
        300 * _GB,
        121 * _TFLOP,
        "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4): 24 GB GDDR6, "
        "300 GB/s, BF16 242 TFLOPS with sparsity -> 121 dense",
    ),
    GpuSpec(
        "A10G",
        24 * _GIB,
        600 * _GB,
        125 * _TFLOP,
        "UNCERTAIN: NVIDIA publishes no A10G datasheet (AWS-only part, EC2 G5). 24 GB, 600 GB/s "
        "and BF16 125 TFLOPS dense are the NVIDIA A10 datasheet values; the A10G runs at "
        "different clocks and some sources quote ~70 TFLOPS dense tensor BF16 for it. "
        "Measure before relying on the compute figure.",
    ),
    GpuSpec(
        "T4",
        16 * _GIB,
        320 * _GB,
        65 * _TFLOP,
        "NVIDIA T4 Tensor Core GPU datasheet: 16 GB GDDR6, 320 GB/s, FP16 mixed precision "
        "65 TFLOPS (Turing has no BF16; the figure is FP16)",
        bf16_supported=False,
    ),
)

_ALIASES: dict[str, str] = {
    "h200-sxm": "H200",
    "h100": "H100-SXM",
    "h100sxm": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100pcie": "H100-PCIe",
    "a100": "A100-80GB",
    "a100-80g": "A100-80GB",
    "a100-sxm-80gb": "A100-80GB",
    "a100-40g": "A100-40GB",
    "a100-sxm-40gb": "A100-40GB",
    "a10": "A10G",
    "tesla-t4": "T4",
    "nvidia-l4": "L4",
}

GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in _CATALOGUE}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


_LOOKUP: dict[str, GpuSpec] = {_key(spec.name): spec for spec in _CATALOGUE}
_LOOKUP.update({_key(alias): GPUS[target] for alias, target in _ALIASES.items()})


def get_gpu(name: str) -> GpuSpec:
    """Catalogue entry by name, case-insensitive, with aliases ("h100" -> H100-SXM)."""
    spec = _LOOKUP.get(_key(str(name)))
    if spec is None:
        raise ValueError(
            f"gpu={name!r} is not in the catalogue; known: {sorted(GPUS)} "
            f"(aliases: {sorted(_ALIASES)})"
        )
    return spec
