"""The device probe: this machine has no GPU; a fake NVML checks the GPU path."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pynvml
import pytest

from capacity import probe


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch):
    monkeypatch.setattr(probe, "_reported_reasons", set())


def test_no_gpu_here_returns_nothing_and_logs_once(caplog):
    try:  # this test is about the machine without a GPU
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine")
    except pynvml.NVMLError:
        pass
    with caplog.at_level(logging.INFO, logger="capacity.probe"):
        assert probe.probe_gpus() == []
        assert probe.probe_gpus(visible_only=True) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "capacity.probe"]
    assert len(lines) == 1
    assert lines[0].startswith("no GPU: NVML unavailable (")
    assert probe.describe_devices().startswith("no GPU (NVML: ")


class FakeNvml:
    """Two H200s; NVMLError is the real class so the probe's except clauses match."""

    NVMLError = pynvml.NVMLError

    def __init__(self, count: int = 2, util_fails: bool = False) -> None:
        self.count, self.util_fails, self.shutdowns = count, util_fails, 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}aaa-bbbb"

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        if self.util_fails:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=40 + h)

    def nvmlDeviceGetPowerUsage(self, h):
        if self.util_fails:  # MIG instances report neither
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 350_000 + 1000 * h  # milliwatts


def test_probe_reads_every_gpu(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setattr(probe, "pynvml", fake)
    samples = probe.probe_gpus()
    assert samples == [
        probe.GpuSample(0, "NVIDIA H200", 2**30, 141 * 2**30, 40.0, 350.0),
        probe.GpuSample(1, "NVIDIA H200", 2 * 2**30, 141 * 2**30, 41.0, 351.0),
    ]
    assert fake.shutdowns == 1
    text = probe.describe_devices()
    assert text.splitlines()[1] == (
        "GPU 1: NVIDIA H200, 2.0 / 141.0 GiB used, utilization 41%, 351 W"
    )


@pytest.mark.parametrize(
    ("env", "indices"),
    [(None, [0, 1]), ("1", [1]), ("", []), ("0,1", [0, 1]), ("GPU-1aaa", [1]), ("7", [])],
)
def test_visible_only_follows_cuda_visible_devices(monkeypatch, env, indices):
    monkeypatch.setattr(probe, "pynvml", FakeNvml())
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert [s.index for s in probe.probe_gpus(visible_only=True)] == indices
    assert len(probe.probe_gpus()) == 2  # all devices unless asked


def test_unreadable_utilization_is_nan_not_a_failure(monkeypatch):
    monkeypatch.setattr(probe, "pynvml", FakeNvml(util_fails=True))
    (first, _) = probe.probe_gpus()
    assert first.utilization_pct != first.utilization_pct  # NaN
    assert first.power_w != first.power_w
    assert "utilization n/a" in probe.describe_devices()


def test_zero_devices_is_no_gpu(monkeypatch):
    monkeypatch.setattr(probe, "pynvml", FakeNvml(count=0))
    assert probe.probe_gpus() == []
    assert probe.describe_devices() == "no GPU (NVML sees 0 devices)"
