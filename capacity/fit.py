"""Does a model fit one device, and if not, what would: the refusal every entry point shares.

`plan`, `plan --write-cluster-yaml` and a replica starting up all ask `check_fits`; a model that
cannot hold its weights, the reserve and one max_model_len sequence of KV is refused with a
message in GiB (weights, reserve, what is left for KV) that names the smallest tensor-parallel
degree on the same GPU, and the smallest catalogue GPU, on which it would fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity import memory
from capacity.gpus import GPUS, GpuSpec

TP_DEGREES = (2, 4, 8)


class DoesNotFit(ValueError):
    """A model too large for the device it was planned or started on."""


@dataclass(frozen=True, slots=True)
class FitInputs:
    what: str  # "model mixtral (Mixtral-8x7B), 46.70 B params, bf16"
    weight_bytes: int
    one_seq_kv_bytes: int  # KV of one max_model_len sequence, in whole pages
    max_model_len: int
    utilization: float
    reserve_bytes: int | None = None  # None: memory.default_reserve_bytes of each device
    longest_fitting_len: int | None = None  # the longest sequence the KV left would hold


def _reserve(inputs: FitInputs, device_bytes: int) -> int:
    if inputs.reserve_bytes is not None:
        return inputs.reserve_bytes
    return memory.default_reserve_bytes(device_bytes)


def _message(inputs: FitInputs, device: str, device_bytes: int, tp: int = 1) -> str | None:
    return memory.does_not_fit(
        inputs.what,
        device,
        device_bytes,
        inputs.utilization,
        -(-inputs.weight_bytes // tp),
        _reserve(inputs, device_bytes),
        -(-inputs.one_seq_kv_bytes // tp),
    )


def smallest_fixes(inputs: FitInputs, gpu: GpuSpec) -> list[str]:
    """The smallest tensor-parallel degree of `gpu`, and the smallest single catalogue GPU,
    that hold the model (weights and KV heads split evenly across tensor-parallel ranks)."""
    fixes = []
    for tp in TP_DEGREES:
        if _message(inputs, gpu.name, gpu.memory_bytes, tp) is None:
            per_gpu = inputs.weight_bytes / tp / memory.GIB
            fixes.append(
                f"tensor parallelism over {tp} x {gpu.name} ({per_gpu:.2f} GiB of weights each)"
            )
            break
    for spec in sorted(GPUS.values(), key=lambda s: s.memory_bytes):
        if (
            spec.memory_bytes > gpu.memory_bytes
            and _message(inputs, spec.name, spec.memory_bytes) is None
        ):
            fixes.append(f"one {spec.name} ({spec.memory_bytes / memory.GIB:.0f} GiB)")
            break
    return fixes


def min_device_bytes(inputs: FitInputs) -> int:
    """The smallest device that holds weights, reserve and one sequence at this utilization."""
    need = inputs.weight_bytes + inputs.one_seq_kv_bytes
    if inputs.reserve_bytes is not None:
        return math.ceil((need + inputs.reserve_bytes) / inputs.utilization)
    # default reserve = 2 GiB + 5 % of the device: d x u >= need + 2 GiB + 0.05 d
    return math.ceil((need + 2 * memory.GIB) / (inputs.utilization - 0.05))


def check_fits(inputs: FitInputs, device: str, device_bytes: int, gpu: GpuSpec | None) -> None:
    """Raise DoesNotFit with the GiB message, what would fit, and what else to try."""
    message = _message(inputs, device, device_bytes)
    if message is None:
        return
    usable = int(device_bytes * inputs.utilization)
    fixes = smallest_fixes(inputs, gpu) if gpu is not None else []
    if inputs.weight_bytes + _reserve(inputs, device_bytes) < usable and inputs.longest_fitting_len:
        fixes.insert(0, f"a max_model_len of at most {inputs.longest_fitting_len}")
    smallest = min_device_bytes(inputs) / memory.GIB
    fits = f" It would fit with {'; or '.join(fixes)}." if fixes else ""
    raise DoesNotFit(
        f"{message} (one {inputs.max_model_len}-token sequence).{fits} A single device needs at "
        f"least {smallest:.1f} GiB; a smaller dtype or a quantised checkpoint needs less."
    )
