"""A capacity plan's result: the `Plan` record, its budget table, JSON and printed text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capacity import memory
from capacity.params import ParamCount, quantization_config

if TYPE_CHECKING:
    from capacity.planner import PlanInputs

_GIB = 1024**3


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    params: ParamCount
    split: memory.MemorySplit
    memory_watermark: float
    max_concurrency_avg: int
    max_concurrency_max_len: int
    decode_step_s: float
    decode_bound: str  # "memory" or "compute"
    prefill_s_per_request: float
    raw_requests_per_s: float
    replica_requests_per_s: float
    replica_tokens_per_s: float
    replicas_at_peak: int
    hot_replicas: int
    cold_max_replicas: int
    kv_bytes_avg_seq: int = 0  # KV of one average sequence, window-bounded on sliding layers
    group_windows: tuple[int | None, ...] = (None,)  # paging groups (capacity.memory)
    warnings: tuple[str, ...] = field(default=())

    @property
    def num_params(self) -> int:
        return self.params.total

    def budget_rows(self) -> list[tuple[str, str]]:
        s = self.split
        gib = lambda b: f"{b / _GIB:.2f} GiB"  # noqa: E731
        return [
            ("device memory", gib(s.device_bytes)),
            (f"weights ({self._weights_label()})", gib(s.weight_bytes)),
            *self._lora_rows(gib),
            ("reserve (CUDA ctx, activations, fragmentation)", gib(s.reserve_bytes)),
            (
                f"KV region (hard cap, {s.num_blocks} blocks x {s.block_size_tokens} tok)",
                gib(s.kv_region_bytes),
            ),
            ("KV bytes per token (all layers)", f"{s.kv_bytes_per_token:,} B"),
            (
                f"KV of one avg {self._avg_len()}-token sequence",
                f"{self.kv_bytes_avg_seq / 2**20:,.1f} MiB",
            ),
            ("KV capacity (tokens inside every window)", f"{s.kv_capacity_tokens:,} tokens"),
            (f"max concurrency @ avg {self._avg_len()} tok", f"{self.max_concurrency_avg}"),
            (
                f"max concurrency @ max_model_len {self.inputs.max_model_len}",
                f"{self.max_concurrency_max_len}",
            ),
            ("memory watermark", f"{self.memory_watermark:.1%}"),
        ]

    def _lora_rows(self, gib) -> list[tuple[str, str]]:
        i = self.inputs
        if not i.max_loras:
            return []
        label = f"LoRA slots ({i.max_loras} x rank {i.max_lora_rank}, engine.max_loras)"
        return [(label, gib(self.split.lora_slot_bytes))]

    def _weights_label(self) -> str:
        p, q = self.params, quantization_config(self.inputs.model_config)
        text = f"{p.total / 1e9:.2f} B params" + ("" if p.exact else " (estimated)")
        if p.active != p.total:
            text += f", {p.active / 1e9:.2f} B active per token"
        if q:
            return text + f", {q.get('quant_method')} quantised, rest {self.inputs.dtype}"
        return text + f", {self.inputs.dtype}"

    def _avg_len(self) -> int:
        return self.inputs.avg_input_tokens + self.inputs.avg_output_tokens

    def to_dict(self) -> dict[str, Any]:
        s, i = self.split, self.inputs
        return {
            "gpu": i.spec.name,
            "dtype": i.dtype,
            "num_params": self.num_params,
            "num_params_active": self.params.active,
            "num_params_exact": self.params.exact,
            "kv_bytes_avg_seq": self.kv_bytes_avg_seq,
            "num_paging_groups": s.num_paging_groups,
            "device_bytes": s.device_bytes,
            "weight_bytes": s.weight_bytes,
            "reserve_bytes": s.reserve_bytes,
            "max_loras": i.max_loras,
            "max_lora_rank": i.max_lora_rank,
            "lora_slot_bytes": s.lora_slot_bytes,
            "kv_region_bytes": s.kv_region_bytes,
            "kv_bytes_per_token": s.kv_bytes_per_token,
            "block_size_tokens": s.block_size_tokens,
            "num_kv_blocks": s.num_blocks,
            "kv_capacity_tokens": s.kv_capacity_tokens,
            "memory_watermark": self.memory_watermark,
            "max_concurrency_avg": self.max_concurrency_avg,
            "max_concurrency_max_len": self.max_concurrency_max_len,
            "decode_step_s": self.decode_step_s,
            "decode_bound": self.decode_bound,
            "prefill_s_per_request": self.prefill_s_per_request,
            "raw_requests_per_s": self.raw_requests_per_s,
            "replica_requests_per_s": self.replica_requests_per_s,
            "replica_tokens_per_s": self.replica_tokens_per_s,
            "peak_qps": i.peak_qps,
            "replicas_at_peak": self.replicas_at_peak,
            "hot_replicas": self.hot_replicas,
            "cold_max_replicas": self.cold_max_replicas,
            "warnings": list(self.warnings),
        }


def format_plan(p: Plan) -> str:
    """Human-readable budget table, throughput and replicas (aligned columns)."""
    i = p.inputs
    lines = [
        f"Capacity plan: {i.spec.name}, {i.dtype}, avg {i.avg_input_tokens} in + "
        f"{i.avg_output_tokens} out tokens, max_model_len {i.max_model_len}, "
        f"peak {i.peak_qps:g} QPS",
        "",
        "Memory budget (R4)",
    ]
    rows = p.budget_rows()
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    lines += [f"  {k:<{width}}  {v:>{vwidth}}" for k, v in rows]
    eff = i.utilization if i.effective_utilization is None else i.effective_utilization
    bound = p.decode_bound
    thr = [
        ("decode step @ max concurrency", f"{p.decode_step_s * 1e3:.2f} ms ({bound}-bound)"),
        ("prefill per request", f"{p.prefill_s_per_request * 1e3:.2f} ms"),
        ("roofline requests/s per replica", f"{p.raw_requests_per_s:.2f}"),
        (
            f"planned requests/s (x {eff:g} util x {i.safety:g} safety)",
            f"{p.replica_requests_per_s:.2f}",
        ),
        ("planned output tokens/s per replica", f"{p.replica_tokens_per_s:,.0f}"),
    ]
    rep = [
        ("replicas at peak", f"{p.replicas_at_peak}"),
        (f"hot pool ({i.hot_fraction:.0%})", f"{p.hot_replicas}"),
        ("cold pool max", f"{p.cold_max_replicas}"),
    ]
    width = max(len(k) for k, _ in thr + rep)
    lines += ["", "Throughput (roofline, R6)"]
    lines += [f"  {k:<{width}}  {v}" for k, v in thr]
    lines += ["", "Replicas (R5/R6)"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rep]
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)
