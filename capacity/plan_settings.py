"""What a capacity plan decides for cluster.yaml: engine limits, pool sizes, per-replica capacity.

Pure arithmetic on a finished `Plan` (capacity/planner.py); `capacity/cluster_yaml.py` writes the
result into the file. Each value and where it comes from:

| key                                  | from the plan                                             |
|--------------------------------------|-----------------------------------------------------------|
| engine.max_num_seqs                  | max concurrency at the average length (budget table, R4)  |
| engine.min_num_seqs                  | max concurrency at max_model_len: the window's safe floor |
| engine.max_num_batched_tokens        | decodes of max_num_seqs + the roofline knee (below)       |
| engine.max_model_len                 | the plan's max_model_len                                  |
| engine.block_size_tokens             | the plan's block size                                     |
| engine.gpu_memory_utilization        | the plan's memory fraction (--utilization)                |
| engine.kv_cache_bytes                | null: a GPU replica sizes KV from measured free memory;   |
|                                      | with `pin_kv_bytes`, the plan's KV region in bytes        |
| engine.max_loras, max_lora_rank      | `plan --max-loras`: slots the budget set aside (if > 0)   |
| pools.hot.num_replicas               | hot share of the replicas at peak (R5/R6)                 |
| pools.cold.max_replicas              | the rest                                                  |
| controller.replica_capacity_rps      | planned requests/s per replica                            |

With a calibrated profile (`plan --profile`) the measured requests/s per replica replaces the
roofline's in the replica counts and the per-replica capacity, as in the printed plan.

The per-step token budget: below the roofline knee a step is bound by reading the weights, so
tokens up to the knee ride along almost free; past it each token adds compute time and stalls
every running decode. knee = dtype bytes x FLOP/s / (2 x bandwidth) tokens (weights/bandwidth
equals 2 x params x tokens / FLOP/s there). The budget holds one decode token per running
sequence plus one knee of prefill, rounded up to a power of two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity import memory
from capacity.planner import Plan, hot_cold_split, replicas_for_peak

MIN_BATCHED_TOKENS = 64
MAX_BATCHED_TOKENS = 16384


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """The cluster.yaml values a plan owns; `kv_cache_bytes` None means "size from the device"."""

    max_num_seqs: int
    min_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size_tokens: int
    gpu_memory_utilization: float
    kv_cache_bytes: int | None
    hot_replicas: int
    cold_max_replicas: int
    replica_capacity_rps: float
    planned_kv_bytes: int  # the plan's KV region, reported even when not pinned
    max_loras: int = 0  # LoRA slots the plan set memory aside for (written only when > 0)
    max_lora_rank: int = 16

    def engine_values(self) -> dict[str, int | float | None]:
        return {
            "max_num_seqs": self.max_num_seqs,
            "min_num_seqs": self.min_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "block_size_tokens": self.block_size_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_bytes": self.kv_cache_bytes,
            **(
                {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank}
                if self.max_loras
                else {}
            ),
        }


def knee_tokens(p: Plan) -> int:
    """Tokens per step where the roofline turns from memory-bound to compute-bound."""
    gpu = p.inputs.spec
    return math.ceil(
        memory.dtype_bytes(p.inputs.dtype) * gpu.bf16_flops_per_s / (2 * gpu.bandwidth_bytes_per_s)
    )


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def batched_tokens(p: Plan, max_num_seqs: int) -> int:
    want = _pow2_at_least(max_num_seqs + knee_tokens(p))
    return min(MAX_BATCHED_TOKENS, max(MIN_BATCHED_TOKENS, want))


def plan_settings(
    p: Plan, *, pin_kv_bytes: bool = False, measured_rps: float | None = None
) -> PlanSettings:
    """The values `--write-cluster-yaml` writes (see the module table). `measured_rps` (planned
    requests/s per replica from a calibrated profile, `plan --profile`) replaces the roofline's
    figure for the replica counts and the per-replica capacity."""
    max_seqs = min(p.max_concurrency_avg, 65536)
    min_seqs = max(1, min(p.max_concurrency_max_len, max_seqs))
    rps, hot, cold = p.replica_requests_per_s, p.hot_replicas, p.cold_max_replicas
    if measured_rps is not None:
        rps = measured_rps
        hot, cold = hot_cold_split(replicas_for_peak(p.inputs.peak_qps, rps), p.inputs.hot_fraction)
    return PlanSettings(
        max_num_seqs=max_seqs,
        min_num_seqs=min_seqs,
        max_num_batched_tokens=batched_tokens(p, max_seqs),
        max_model_len=p.inputs.max_model_len,
        block_size_tokens=p.inputs.block_size_tokens,
        gpu_memory_utilization=p.inputs.utilization,
        kv_cache_bytes=p.split.kv_region_bytes if pin_kv_bytes else None,
        hot_replicas=hot,
        cold_max_replicas=cold,
        replica_capacity_rps=float(f"{rps:.4g}"),  # 4 significant digits, never 0
        planned_kv_bytes=p.split.kv_region_bytes,
        max_loras=p.inputs.max_loras,
        max_lora_rank=p.inputs.max_lora_rank,
    )
