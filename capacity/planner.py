"""Capacity planner (R4 + R6, docs/requirements.md): memory budget, roofline throughput,
replicas at peak.

Pure arithmetic on a model's config.json and a catalogue GPU: no torch, no device access. Every
memory number comes from `capacity.memory` (the one formula); this module only combines them.

Throughput is a roofline estimate per replica:

* decode step at concurrency C = max(memory time, compute time) where
  memory time = (weight bytes + C x KV bytes of the average context) / bandwidth and
  compute time = 2 x params per token x C / dense BF16 FLOP/s; average context = input +
  output / 2; KV of a context is window-bounded on sliding layers (capacity.memory.seq_kv_bytes);
  params per token are the active ones of a mixture of experts, without the embedding lookup;
* prefill per request = max(2 x params per token x input tokens / FLOP/s, weight bytes / bandwidth);
* a request costs prefill + output tokens x step / C of replica time, so
  raw requests/s = 1 / (prefill + output x step / C) at C = the KV region's max concurrency;
* planned requests/s = raw x effective utilisation x safety (R6), tokens/s = requests/s x output.

replicas_at_peak = ceil(peak QPS / planned requests/s); hot = ceil(hot_fraction x replicas),
cold_max = the rest (R5/R6: hot pool 70 % of peak, 30 % elastic cold pool).

Weights count every parameter exactly (capacity.params), at their quantised bits when the config
says so. A model that cannot hold its weights, the reserve and one max_model_len sequence is
refused (capacity.fit.DoesNotFit) with the GiB figures and what would fit instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capacity import memory
from capacity.adapters import lora_slot_bytes
from capacity.fit import FitInputs, check_fits
from capacity.gpus import GpuSpec, get_gpu
from capacity.memory import default_reserve_bytes
from capacity.params import ParamCount, count_params, quantization_config, transformers_config
from capacity.plan_result import Plan, format_plan
from common.validate import check_order, check_range

__all__ = ["Plan", "PlanInputs", "default_reserve_bytes", "format_plan", "plan"]
_GIB = 1024**3
_OWNER = "PlanInputs"


def _ceil(x: float) -> int:
    """ceil that ignores float noise (2000 / 20.000000000001 is 100 replicas, not 101)."""
    return math.ceil(round(x, 9))


# --- R6 worked example helpers ---------------------------------------------------------------


def requests_per_s_per_gpu(
    compute_s_per_request: float, effective_utilization: float, safety: float
) -> float:
    """R6: per-GPU capacity = effective utilisation x per-request throughput x safety factor.

    per-request throughput = 1 / compute seconds per request. Taken literally, R6's example
    (35 ms, 40 % utilisation, safety 0.7-0.85) gives 0.4 x 28.6 x 0.8 = 9.1 req/s (219 GPUs at
    2000 QPS), not the "~20 req/s, ~100 GPUs" it prints. The document's numbers are reproduced
    exactly when the 35 ms is read as the time per request *already measured at* the achieved
    (40 %) utilisation, i.e. effective_utilization=1.0, with the low-end safety 0.7:
    28.57 x 0.7 = 20.0 req/s -> 2000 / 20 = 100 GPUs. No reading that applies 40 % on top of
    35 ms reaches 20 without an extra, unstated batching factor (~1.75-2.2x).
    """
    check_range(
        "requests_per_s_per_gpu",
        "compute_s_per_request",
        compute_s_per_request,
        0,
        None,
        lo_open=True,
    )
    check_range(
        "requests_per_s_per_gpu", "effective_utilization", effective_utilization, 0, 1, lo_open=True
    )
    check_range("requests_per_s_per_gpu", "safety", safety, 0, 1, lo_open=True)
    return effective_utilization * safety / compute_s_per_request


def replicas_for_peak(peak_qps: float, requests_per_s_per_replica: float) -> int:
    check_range(
        "replicas_for_peak",
        "requests_per_s_per_replica",
        requests_per_s_per_replica,
        0,
        None,
        lo_open=True,
    )
    return _ceil(peak_qps / requests_per_s_per_replica)


def hot_cold_split(replicas: int, hot_fraction: float) -> tuple[int, int]:
    """(hot, cold_max): hot = ceil(hot_fraction x replicas), the rest elastic."""
    hot = min(replicas, _ceil(hot_fraction * replicas))
    return hot, replicas - hot


# --- inputs and plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """What the planner needs; validated on construction, errors name the field.

    `utilization` is the fraction of device memory the engine may use (weights + reserve + KV);
    `effective_utilization` derates the roofline throughput (R6) and defaults to `utilization`.
    """

    model_config: Mapping[str, Any]
    gpu: GpuSpec | str
    avg_input_tokens: int
    avg_output_tokens: int
    max_model_len: int
    peak_qps: float
    dtype: str = "bf16"
    ttft_p99_s: float | None = None
    safety: float = 0.8
    utilization: float = 0.9
    effective_utilization: float | None = None
    hot_fraction: float = 0.7
    block_size_tokens: int = 16
    reserve_bytes: int | None = None
    model_name: str | None = None  # what messages call the model (default: its model_type)
    max_loras: int = 0  # LoRA adapter slots per replica (engine.max_loras; `tideserve adapters`)
    max_lora_rank: int = 16  # the slots' rank (engine.max_lora_rank)

    def __post_init__(self) -> None:
        if not isinstance(self.model_config, Mapping):
            raise ValueError(f"{_OWNER}.model_config must be a dict (a parsed config.json)")
        if not isinstance(self.gpu, GpuSpec):
            object.__setattr__(self, "gpu", get_gpu(self.gpu))
        memory.dtype_bytes(self.dtype)  # raises naming the allowed dtypes
        memory.KVShape.from_config(self.model_config)  # raises on a config without a shape
        check_range(_OWNER, "avg_input_tokens", self.avg_input_tokens, 1, None, integer=True)
        check_range(_OWNER, "avg_output_tokens", self.avg_output_tokens, 1, None, integer=True)
        check_range(_OWNER, "max_model_len", self.max_model_len, 1, None, integer=True)
        avg_len = self.avg_input_tokens + self.avg_output_tokens
        check_order(
            _OWNER,
            ("avg_input_tokens + avg_output_tokens", avg_len),
            ("max_model_len", self.max_model_len),
        )
        check_range(_OWNER, "peak_qps", self.peak_qps, 0, None, lo_open=True)
        if self.ttft_p99_s is not None:
            check_range(_OWNER, "ttft_p99_s", self.ttft_p99_s, 0, None, lo_open=True)
        check_range(_OWNER, "safety", self.safety, 0, 1, lo_open=True)
        check_range(_OWNER, "utilization", self.utilization, 0, 1, lo_open=True)
        if self.effective_utilization is not None:
            check_range(
                _OWNER, "effective_utilization", self.effective_utilization, 0, 1, lo_open=True
            )
        check_range(_OWNER, "hot_fraction", self.hot_fraction, 0, 1)
        check_range(_OWNER, "block_size_tokens", self.block_size_tokens, 1, None, integer=True)
        if self.reserve_bytes is not None:
            check_range(_OWNER, "reserve_bytes", self.reserve_bytes, 0, None, integer=True)
        check_range(_OWNER, "max_loras", self.max_loras, 0, None, integer=True)
        check_range(_OWNER, "max_lora_rank", self.max_lora_rank, 1, None, integer=True)

    @property
    def spec(self) -> GpuSpec:
        assert isinstance(self.gpu, GpuSpec)
        return self.gpu


def model_view(config: Mapping[str, Any]):
    """The config as transformers reads it (derived fields such as layer_types filled in), or
    the raw dict when transformers does not know its model_type."""
    return transformers_config(dict(config)) or config


def _describe(inputs: PlanInputs, params: ParamCount) -> str:
    name = inputs.model_name or inputs.model_config.get("model_type") or "model"
    return f"model {name} ({params.total / 1e9:.2f} B parameters, {inputs.dtype})"


def _longest_fitting_len(left_bytes: int, page_bytes: int, layout, inputs: PlanInputs) -> int:
    """Longest sequence whose pages fit in `left_bytes` (0 if none), by bisection."""
    pages, bs = max(0, left_bytes) // page_bytes, inputs.block_size_tokens
    lo, hi = 0, inputs.max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (
            (mid, hi)
            if memory.seq_blocks(layout.group_windows, mid, bs) <= pages
            else (lo, mid - 1)
        )
    return lo


def _memory(inputs: PlanInputs, cfg, params: ParamCount) -> memory.MemorySplit:
    """Weights + reserve + KV region; DoesNotFit unless one max_model_len sequence fits."""
    gpu, dtype, bs = inputs.spec, inputs.dtype, inputs.block_size_tokens
    weights = memory.weight_bytes(params, dtype, quantization_config(inputs.model_config))
    reserve = default_reserve_bytes(gpu.memory_bytes)
    if inputs.reserve_bytes is not None:
        reserve = inputs.reserve_bytes
    lora = lora_slot_bytes(cfg, dtype, inputs.max_loras, inputs.max_lora_rank)
    layout, page = memory.paging_layout(cfg), memory.block_bytes(cfg, dtype, bs)
    left = int(gpu.memory_bytes * inputs.utilization) - weights - lora - reserve
    fit = FitInputs(
        what=_describe(inputs, params),
        weight_bytes=weights + lora,  # the slots are fixed bytes, allocated at start as weights
        one_seq_kv_bytes=memory.seq_blocks(layout.group_windows, inputs.max_model_len, bs) * page,
        max_model_len=inputs.max_model_len,
        utilization=inputs.utilization,
        reserve_bytes=inputs.reserve_bytes,
        longest_fitting_len=_longest_fitting_len(left, page, layout, inputs),
    )
    check_fits(fit, f"one {gpu.name}", gpu.memory_bytes, gpu)
    return memory.split_memory(
        gpu.memory_bytes, weights, reserve, inputs.utilization, cfg, dtype, bs, lora
    )


def _roofline(inputs: PlanInputs, params: ParamCount, split, conc: int, kv_avg_ctx: int):
    """(decode step s, bound, prefill s per request, raw requests/s) at concurrency `conc`."""
    gpu = inputs.spec
    flops, bandwidth = gpu.bf16_flops_per_s, gpu.bandwidth_bytes_per_s
    mem_s = (split.weight_bytes + conc * kv_avg_ctx) / bandwidth
    compute_s = 2 * params.flop_params * conc / flops
    step_s = max(mem_s, compute_s)
    prefill_s = max(
        2 * params.flop_params * inputs.avg_input_tokens / flops, split.weight_bytes / bandwidth
    )
    raw_rps = 1.0 / (prefill_s + inputs.avg_output_tokens * step_s / conc)
    return step_s, ("memory" if mem_s >= compute_s else "compute"), prefill_s, raw_rps


def _warnings(inputs: PlanInputs, params: ParamCount, prefill_s: float) -> tuple[str, ...]:
    gpu, dtype = inputs.spec, inputs.dtype
    out: list[str] = []
    if not gpu.bf16_supported and memory.dtype_bytes(dtype) == 2 and "bf" in dtype.lower():
        out.append(f"{gpu.name} has no BF16; serve in float16 (compute figure is FP16)")
    if inputs.ttft_p99_s is not None and prefill_s > inputs.ttft_p99_s:
        out.append(
            f"prefill alone takes {prefill_s * 1e3:.0f} ms > ttft_p99_s "
            f"{inputs.ttft_p99_s * 1e3:.0f} ms at {inputs.avg_input_tokens} input tokens"
        )
    if not params.exact:
        out.append(f"parameter count {params.source}")
    from serving.engine.features import UnsupportedModelError, check_model  # torch-free

    try:
        check_model(inputs.model_config, "paged")
    except UnsupportedModelError as err:
        out.append(f"tideserve's engine would refuse this model: {err}")
    return tuple(out)


def plan(inputs: PlanInputs) -> Plan:
    """Memory budget table + roofline throughput + replicas; DoesNotFit when the model won't."""
    cfg = model_view(inputs.model_config)
    params = count_params(cfg)
    split = _memory(inputs, cfg, params)
    windows, bs = memory.paging_layout(cfg).group_windows, inputs.block_size_tokens
    avg_len = inputs.avg_input_tokens + inputs.avg_output_tokens
    conc_avg = memory.max_concurrency(split.num_blocks, avg_len, bs, windows)
    conc_max = memory.max_concurrency(split.num_blocks, inputs.max_model_len, bs, windows)
    used = split.weight_bytes + split.lora_slot_bytes + split.reserve_bytes + split.kv_region_bytes
    avg_ctx = math.ceil(inputs.avg_input_tokens + inputs.avg_output_tokens / 2)
    kv_avg_ctx = memory.seq_kv_bytes(cfg, inputs.dtype, avg_ctx)
    step_s, bound, prefill_s, raw_rps = _roofline(inputs, params, split, conc_avg, kv_avg_ctx)
    eff = (
        inputs.utilization if inputs.effective_utilization is None else inputs.effective_utilization
    )
    rps = raw_rps * eff * inputs.safety
    replicas = replicas_for_peak(inputs.peak_qps, rps)
    hot, cold = hot_cold_split(replicas, inputs.hot_fraction)
    return Plan(
        inputs=inputs,
        params=params,
        split=split,
        memory_watermark=used / split.device_bytes,
        max_concurrency_avg=conc_avg,
        max_concurrency_max_len=conc_max,
        decode_step_s=step_s,
        decode_bound=bound,
        prefill_s_per_request=prefill_s,
        raw_requests_per_s=raw_rps,
        replica_requests_per_s=rps,
        replica_tokens_per_s=rps * inputs.avg_output_tokens,
        replicas_at_peak=replicas,
        hot_replicas=hot,
        cold_max_replicas=cold,
        kv_bytes_avg_seq=memory.seq_kv_bytes(cfg, inputs.dtype, avg_len),
        group_windows=windows,
        warnings=_warnings(inputs, params, prefill_s),
    )


# --- measured costs (capacity.calibrate profiles) ----------------------------------------------


def throughput_from_profile(
    profile: Any, concurrency: int, avg_input: float, avg_output: float
) -> tuple[float, float, float]:
    """Steady-state (output tokens/s, requests/s, mean step seconds) from a calibrated profile.

    `profile` is anything with predict_step_s(num_tokens, kv_tokens_read) (a
    capacity.calibrate.Profile). At constant concurrency C every running sequence emits one token
    per step, a request lasts about avg_output steps, so each step carries C decode tokens plus
    C x avg_input / avg_output amortised prefill tokens; decodes read C x (avg_input +
    avg_output / 2) KV tokens and the amortised prefill reads its own tokens.
    """
    check_range("throughput_from_profile", "concurrency", concurrency, 1)
    check_range("throughput_from_profile", "avg_output", avg_output, 1)
    check_range("throughput_from_profile", "avg_input", avg_input, 0)
    c = float(concurrency)
    prefill = c * avg_input / avg_output
    kv = c * (avg_input + avg_output / 2) + prefill
    step_s = float(profile.predict_step_s(c + prefill, kv))
    if step_s <= 0:
        raise ValueError(f"profile predicts a non-positive step time ({step_s} s)")
    tokens_per_s = c / step_s
    return tokens_per_s, tokens_per_s / avg_output, step_s
