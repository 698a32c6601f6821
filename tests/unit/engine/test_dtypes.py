"""dtype `auto` per machine (serving/engine/dtypes.py), on constructed machines."""

from __future__ import annotations

import pytest
import torch

from serving.engine import dtypes
from serving.engine.loader import resolve_dtype

EPYC_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n"
XEON_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve bf16\n"


def test_parse_cpu_flags():
    assert dtypes.parse_cpu_flags(EPYC_AVX2) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert "amx_bf16" in dtypes.parse_cpu_flags(XEON_AMX)
    assert "asimd" in dtypes.parse_cpu_flags(ARM)
    assert dtypes.parse_cpu_flags("") == frozenset()


def test_read_cpu_flags_missing_file_is_empty(tmp_path):
    assert dtypes.read_cpu_flags(str(tmp_path / "absent")) == frozenset()
    path = tmp_path / "cpuinfo"
    path.write_text(XEON_AMX)
    assert dtypes.cpu_runs_bf16_fast(dtypes.read_cpu_flags(str(path)))


@pytest.mark.parametrize(
    ("device", "model_dtype", "cpuinfo", "want"),
    [
        ("cpu", torch.bfloat16, XEON_AMX, torch.bfloat16),  # AMX runs the model's bf16 fast
        ("cpu", torch.bfloat16, "flags: avx512f avx512_bf16", torch.bfloat16),
        ("cpu", torch.bfloat16, EPYC_AVX2, torch.float32),  # bf16 would be emulated: slower
        ("cpu", torch.bfloat16, ARM, torch.float32),  # no x86 bf16 units named
        ("cpu", torch.float32, XEON_AMX, torch.float32),  # the model's own dtype is float32
        ("cpu", torch.float16, XEON_AMX, torch.float32),  # fp16 is not what AMX-BF16 speeds up
        ("cpu", None, XEON_AMX, torch.float32),  # unknown saved dtype: exact and safe
        ("cuda", torch.bfloat16, "", torch.bfloat16),
        ("cuda", torch.float16, "", torch.float16),  # the model's own half dtype
        ("cuda", torch.float32, "", torch.bfloat16),  # half the bytes, tensor cores
        ("cuda", None, "", torch.bfloat16),
    ],
)
def test_auto_dtype(device, model_dtype, cpuinfo, want):
    flags = dtypes.parse_cpu_flags(cpuinfo)
    assert dtypes.auto_dtype(device, model_dtype, flags) == want
    assert resolve_dtype("auto", torch.device(device), model_dtype, flags) == want


def test_explicit_dtype_wins_over_the_machine():
    flags = dtypes.parse_cpu_flags(EPYC_AVX2)
    assert resolve_dtype("bfloat16", torch.device("cpu"), torch.float32, flags) == torch.bfloat16
    assert resolve_dtype("float32", torch.device("cuda"), torch.bfloat16, flags) == torch.float32


class _Config:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_config_dtype_reads_old_and_new_names():
    assert dtypes.config_dtype(_Config(dtype=torch.bfloat16)) == torch.bfloat16
    assert dtypes.config_dtype(_Config(torch_dtype="float16")) == torch.float16
    assert dtypes.config_dtype(_Config(dtype="torch.bfloat16")) == torch.bfloat16
    assert dtypes.config_dtype(_Config()) is None
    assert dtypes.config_dtype(_Config(dtype="nonsense")) is None
