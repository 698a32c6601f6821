"""The only module that touches the device: GPU samples through NVML (`pynvml`, nvidia-ml-py).

NVML sees every GPU of the node whatever CUDA_VISIBLE_DEVICES says; `visible_only=True` keeps the
devices this process was given (Ray sets CUDA_VISIBLE_DEVICES for each GPU actor, to "" for an
actor without GPUs). Without a GPU or an NVML library the probe returns [] and says why once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)

_GIB = 1024**3
_reported_reasons: set[str] = set()  # log "no GPU" once per reason, not once per sample


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: float
    power_w: float = float("nan")  # NaN where NVML cannot read the power draw


class _NoGpu(Exception):
    """NVML is unavailable or sees no device; the message is the reason."""


def visible_device_ids(env_value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of ids (indices or UUIDs); None when unset (all visible)."""
    if env_value is None:
        return None
    return [token.strip() for token in env_value.split(",") if token.strip()]


def _is_visible(index: int, uuid: str, visible: list[str] | None) -> bool:
    if visible is None:
        return True
    for token in visible:
        if token.isdigit() and int(token) == index:
            return True
        if token.startswith("GPU-") and uuid.startswith(token):  # CUDA accepts unique prefixes
            return True
    return False


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _sample(index: int) -> tuple[GpuSample, str]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError:  # e.g. not supported on a MIG-enabled device
        utilization = float("nan")
    try:
        power_w = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
    except pynvml.NVMLError:  # MIG instances and some boards do not report it
        power_w = float("nan")
    sample = GpuSample(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization_pct=utilization,
        power_w=float(power_w),
    )
    return sample, _text(pynvml.nvmlDeviceGetUUID(handle))


def _probe(visible_only: bool) -> list[GpuSample]:
    """Samples, or _NoGpu with the reason."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise _NoGpu(f"NVML unavailable ({err})") from err
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise _NoGpu("NVML sees 0 devices")
        visible = visible_device_ids(os.environ.get("CUDA_VISIBLE_DEVICES"))
        samples = []
        for index in range(count):
            sample, uuid = _sample(index)
            if not visible_only or _is_visible(index, uuid, visible):
                samples.append(sample)
        return samples
    except pynvml.NVMLError as err:
        raise _NoGpu(f"NVML failed ({err})") from err
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def probe_gpus(visible_only: bool = False) -> list[GpuSample]:
    """One sample per GPU (visible to this process only, with `visible_only`); [] without one."""
    try:
        return _probe(visible_only)
    except _NoGpu as err:
        reason = str(err)
        if reason not in _reported_reasons:
            _reported_reasons.add(reason)
            log.info("no GPU: %s", reason)
        return []


def describe_devices() -> str:
    """One line per GPU, or 'no GPU (NVML: <reason>)'."""
    try:
        samples = _probe(visible_only=False)
    except _NoGpu as err:
        return f"no GPU ({_describe_reason(err)})"
    lines = []
    for s in samples:
        util = "n/a" if math.isnan(s.utilization_pct) else f"{s.utilization_pct:.0f}%"
        lines.append(
            f"GPU {s.index}: {s.name}, {s.memory_used_bytes / _GIB:.1f} / "
            f"{s.memory_total_bytes / _GIB:.1f} GiB used, utilization {util}"
            + ("" if math.isnan(s.power_w) else f", {s.power_w:.0f} W")
        )
    return "\n".join(lines)


def _describe_reason(err: _NoGpu) -> str:
    cause = err.__cause__
    return f"NVML: {cause}" if cause is not None else str(err)
