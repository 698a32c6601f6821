"""KV budget of a GPU engine with no explicit size: the device memory left after the weights and
the activation peak of a warm-up pass, within `gpu_memory_utilization` of the device (R4).

    budget = utilization x total - (total - free) - warm-up peak above what stays allocated

`total - free` is everything already on the device once the weights are loaded: this process's
weights, its CUDA context and allocator cache, and any other process sharing the GPU. The warm-up
runs one forward of the largest step the scheduler can build (`max_num_batched_tokens` tokens,
logits for up to `max_num_seqs` rows) so its transient activations are held out of the KV region:
the "reserve" row of the capacity plan, measured instead of estimated. The arithmetic is pure
(`kv_budget_bytes`); `measure_cuda` is the only part that touches the device.
"""

from __future__ import annotations

from dataclasses import dataclass

_GIB = 1024**3


@dataclass(frozen=True, slots=True)
class MemoryReading:
    total_bytes: int
    free_bytes: int  # after the weights and the warm-up, with the allocator cache emptied
    warmup_peak_bytes: int  # the warm-up's allocation peak above what stays allocated

    def __post_init__(self) -> None:
        for name in ("total_bytes", "free_bytes", "warmup_peak_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"MemoryReading.{name}={value!r} must be an integer >= 0")
        if self.free_bytes > self.total_bytes:
            raise ValueError(
                f"MemoryReading.free_bytes={self.free_bytes} exceeds total_bytes={self.total_bytes}"
            )


def kv_budget_bytes(reading: MemoryReading, gpu_memory_utilization: float) -> int:
    """Bytes the KV region may take; ValueError naming the numbers and the knob when none."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization!r} is out of range; "
            "allowed: 0.0 < gpu_memory_utilization <= 1.0"
        )
    allowed = int(gpu_memory_utilization * reading.total_bytes)
    in_use = reading.total_bytes - reading.free_bytes
    budget = allowed - in_use - reading.warmup_peak_bytes
    if budget <= 0:
        raise ValueError(
            f"no room for a KV cache: gpu_memory_utilization={gpu_memory_utilization} allows "
            f"{allowed / _GIB:.2f} GiB of {reading.total_bytes / _GIB:.2f} GiB, but "
            f"{in_use / _GIB:.2f} GiB is in use after loading the weights and the warm-up "
            f"peaks at {reading.warmup_peak_bytes / _GIB:.2f} GiB more; raise "
            "engine.gpu_memory_utilization, lower max_num_batched_tokens, or use a larger GPU"
        )
    return budget


def measure_cuda(model, device, num_tokens: int, num_logit_rows: int) -> MemoryReading:
    """One warm-up forward of `num_tokens` tokens on `device`, then the device's free memory.

    GPU only (not run on the CPU test machine): the arithmetic it feeds is unit-tested with
    constructed readings.
    """
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    ids = torch.zeros((1, num_tokens), dtype=torch.long, device=device)
    rows = torch.arange(num_tokens - min(num_logit_rows, num_tokens), num_tokens, device=device)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False, logits_to_keep=rows)
        out.logits.float().softmax(-1)  # the sampler upcasts the kept rows
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    del out, ids, rows
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return MemoryReading(int(total), int(free), max(0, int(peak)))
