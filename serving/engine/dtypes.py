"""What `dtype: auto` means on this machine: a pure decision from the device, the model's own dtype
and the CPU's feature flags (read once, passed in, so the rule is tested with made-up machines).

- CUDA: the model's own half-precision dtype (bfloat16 / float16); a float32 checkpoint runs in
  bfloat16 (half the weights and KV, tensor cores), as vLLM does.
- CPU with native bf16 matrix units (AMX-BF16 or AVX512-BF16 flags): the model's own dtype when it
  is bfloat16 (oneDNN runs bf16 GEMMs about twice as fast as float32 there).
- Any other CPU: float32. Without those units PyTorch emulates bf16 by converting to float32 and
  back around every op, which is slower than float32 itself and less exact.
"""

from __future__ import annotations

import torch

# Flags Linux reports in /proc/cpuinfo for CPUs with native bf16 dot products.
BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
HALF_DTYPES = (torch.bfloat16, torch.float16)


def parse_cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """The feature flags of the first processor in /proc/cpuinfo text (empty if none listed)."""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def read_cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU flags; empty where /proc/cpuinfo does not exist (not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return frozenset()


def cpu_runs_bf16_fast(cpu_flags: frozenset[str]) -> bool:
    return bool(BF16_CPU_FLAGS & cpu_flags)


def auto_dtype(
    device_type: str, model_dtype: torch.dtype | None, cpu_flags: frozenset[str]
) -> torch.dtype:
    """The dtype `auto` resolves to (the rule is in the module docstring)."""
    if device_type == "cuda":
        return model_dtype if model_dtype in HALF_DTYPES else torch.bfloat16
    if model_dtype == torch.bfloat16 and cpu_runs_bf16_fast(cpu_flags):
        return torch.bfloat16
    return torch.float32


def config_dtype(model_config) -> torch.dtype | None:
    """The dtype a checkpoint was saved in (config `dtype`, formerly `torch_dtype`), if stated."""
    value = getattr(model_config, "dtype", None) or getattr(model_config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value.removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) else None
