"""KV budget of a GPU engine from measured free memory (serving/engine/kv_budget.py), checked on
the CPU with constructed readings: the arithmetic, and the loader's CUDA branch that uses it."""

from __future__ import annotations

import pytest
import torch

from capacity import memory
from serving.engine import loader
from serving.engine.config import EngineConfig
from serving.engine.kv_budget import MemoryReading, kv_budget_bytes
from serving.tiny_models import tiny_config

GIB = 1024**3


def test_budget_is_the_allowed_share_minus_what_is_in_use_and_the_warmup_peak():
    # 80 GiB card, 0.9 allowed = 72 GiB; 16 GiB in use (weights, context), warm-up peaks 3 GiB
    reading = MemoryReading(total_bytes=80 * GIB, free_bytes=64 * GIB, warmup_peak_bytes=3 * GIB)
    assert kv_budget_bytes(reading, 0.9) == int(0.9 * 80 * GIB) - 16 * GIB - 3 * GIB
    # another process holding 20 GiB more of the same card leaves that much less
    shared = MemoryReading(80 * GIB, 44 * GIB, 3 * GIB)
    assert kv_budget_bytes(shared, 0.9) == kv_budget_bytes(reading, 0.9) - 20 * GIB


def test_no_room_names_the_numbers_and_the_knob():
    reading = MemoryReading(total_bytes=24 * GIB, free_bytes=8 * GIB, warmup_peak_bytes=2 * GIB)
    with pytest.raises(ValueError, match="gpu_memory_utilization") as err:
        kv_budget_bytes(reading, 0.7)  # 16.8 GiB allowed < 16 in use + 2 peak
    assert "16.80 GiB of 24.00 GiB" in str(err.value) and "16.00 GiB is in use" in str(err.value)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(total_bytes=10, free_bytes=11, warmup_peak_bytes=0), "exceeds total_bytes"),
        (dict(total_bytes=10, free_bytes=-1, warmup_peak_bytes=0), "free_bytes"),
        (dict(total_bytes=10, free_bytes=1, warmup_peak_bytes=0.5), "warmup_peak_bytes"),
    ],
)
def test_readings_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        MemoryReading(**kw)


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1])
def test_utilization_range(bad):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_budget_bytes(MemoryReading(GIB, GIB, 0), bad)


def test_loader_sizes_cuda_kv_from_the_reading_after_warmup():
    mc = tiny_config()
    cfg = EngineConfig(gpu_memory_utilization=0.5)
    calls = []

    def read():
        calls.append(1)
        return MemoryReading(total_bytes=GIB, free_bytes=GIB - 100 * 2**20, warmup_peak_bytes=0)

    dtype, cuda = torch.bfloat16, torch.device("cuda")  # a device object; nothing is allocated
    blocks = loader.num_kv_blocks(cfg, mc, dtype, cuda, 512, read)
    budget = GIB // 2 - 100 * 2**20
    assert calls == [1]
    assert blocks == memory.num_blocks_in_budget(budget, mc, dtype, 16)
    # an explicit size never measures
    pinned = EngineConfig(kv_cache_bytes=8 * 2**20)
    assert loader.num_kv_blocks(pinned, mc, dtype, cuda, 512, read) == (
        memory.num_blocks_in_budget(8 * 2**20, mc, dtype, 16)
    )
    assert calls == [1]
    with pytest.raises(ValueError, match="memory reading"):
        loader.num_kv_blocks(cfg, mc, dtype, cuda, 512, None)
