"""Serve metrics per pool and tier (Prometheus through Ray's metrics agent) and the R10 warning.

Every name below is exported by Ray with the prefix `ray_`: `tideserve_kv_pressure` is scraped as
`ray_tideserve_kv_pressure`, a histogram `vllm_time_to_first_token_seconds` as
`ray_vllm_time_to_first_token_seconds_bucket` / `_sum` / `_count`, a counter `vllm_num_preemptions`
as `ray_vllm_num_preemptions_total`. Where vLLM has a metric of the same meaning we use the name
it exports through Ray (vLLM's `vllm:x` becomes `vllm_x` there, since Ray no longer accepts `:`
in metric names), with its `model_name` label, so Ray Serve LLM's own Grafana panels
(`ray_vllm_num_requests_running`, `ray_vllm_time_to_first_token_seconds_bucket`, ...) read
tideserve replicas too; the rest are `tideserve_*`. Inside a replica Serve adds the tags
`deployment`, `replica` and `application`; ours are `pool` (hot | cold), `model_name` (vLLM's
label) and, where it applies, `tier`, `gpu`, `finished_reason`, `status`, `action` / `knob`.

The R10 early warning, "OOM although memory looks free":

    kv_pressure = running sequences x average sequence length / KV capacity tokens

is the share of the KV pool the running set needs once its sequences reach the current average
length. Above 1 the concurrency cap admits more sequences than the KV budget holds at that length
(the scheduler will preempt or stall): lower the concurrency cap or shorten max lengths.
`tideserve_kv_pressure_at_limit` is the same product at the concurrency limit, the warning before
the running set grows into it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from serving.telemetry import LATENCY_BUCKETS_S, MetricFactory, serve_metric

if TYPE_CHECKING:
    from capacity.probe import GpuSample
    from serving.engine import EngineStats
    from serving.llm.startup import StartupPhases

# vLLM's names, as vLLM exports them through Ray (ray_vllm_*), where the meaning is the same.
TTFT = "vllm_time_to_first_token_seconds"
E2E_LATENCY = "vllm_e2e_request_latency_seconds"
QUEUE_WAIT = "vllm_request_queue_time_seconds"
DECODE_TIME = "vllm_request_decode_time_seconds"
RUNNING_SEQS = "vllm_num_requests_running"
WAITING_SEQS = "vllm_num_requests_waiting"
KV_USAGE = "vllm_kv_cache_usage_perc"
PREEMPTIONS = "vllm_num_preemptions"
PROMPT_TOKENS = "vllm_prompt_tokens"
GENERATION_TOKENS = "vllm_generation_tokens"
REQUEST_SUCCESS = "vllm_request_success"
PREFIX_QUERIES = "vllm_prefix_cache_queries"
PREFIX_HITS = "vllm_prefix_cache_hits"
# Ours: what vLLM has no metric for.
KV_BLOCKS_USED = "tideserve_kv_blocks_used"
KV_BLOCKS_RESERVED = "tideserve_kv_blocks_reserved"
KV_BLOCKS_TOTAL = "tideserve_kv_blocks_total"
TOKENS_PER_SECOND = "tideserve_tokens_per_second"
CONCURRENCY_LIMIT = "tideserve_concurrency_limit"
AVG_SEQ_LEN = "tideserve_avg_seq_len_tokens"
KV_PRESSURE = "tideserve_kv_pressure"
KV_PRESSURE_AT_LIMIT = "tideserve_kv_pressure_at_limit"
ENGINE_QUEUE_WAIT_P50 = "tideserve_engine_queue_wait_p50_seconds"
ENGINE_QUEUE_WAIT_P99 = "tideserve_engine_queue_wait_p99_seconds"
TIMEOUTS = "tideserve_request_timeouts"
REQUESTS = "tideserve_requests"
TUNER_MAX_NUM_SEQS = "tideserve_tuner_max_num_seqs"
TUNER_BATCHED_TOKENS = "tideserve_tuner_max_num_batched_tokens"
TUNER_MOVES = "tideserve_tuner_moves"
GPU_UTILIZATION = "tideserve_gpu_utilization_pct"
GPU_MEMORY_USED = "tideserve_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "tideserve_gpu_memory_total_bytes"
GPU_POWER = "tideserve_gpu_power_watts"
STARTUP = "tideserve_replica_startup_seconds"
# LoRA slots (vLLM exports only vllm_lora_requests_info, the adapters running and waiting).
LORA_HITS = "tideserve_lora_hits"
LORA_LOADS = "tideserve_lora_loads"
LORA_EVICTIONS = "tideserve_lora_evictions"
LORA_SLOTS_USED = "tideserve_lora_slots_used"
LORA_SLOTS_TOTAL = "tideserve_lora_slots_total"

POOL, MODEL, TIER, GPU = "pool", "model_name", "tier", "gpu"
REASON, STATUS, ACTION, KNOB = "finished_reason", "status", "action", "knob"
PHASE = "phase"
# How a request ended at the replica (tideserve_requests{status}).
STATUSES = ("ok", "refused", "timeout", "invalid", "aborted")
# The engine's finish reasons (vllm_request_success{finished_reason}).
FINISH_REASONS = ("stop", "length", "abort")
# How an admitted request's stream ended (the finished_reason of the end-to-end histogram): an
# engine finish reason, or "cancelled" (the caller closed the stream first: the ingress cut it at
# a stop string, or its client left; the replica cannot tell the two apart), "timeout" (it waited
# in the engine past its deadline), "invalid" (the engine refused it as it is), "error" (anything
# else raised, such as a dead engine loop).
END_REASONS = (*FINISH_REASONS, "cancelled", "timeout", "invalid", "error")
_BASE = (POOL, MODEL)

# name -> (kind, tag keys, description)
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    TTFT: ("histogram", (*_BASE, TIER), "Time to first token, from arrival at the replica."),
    E2E_LATENCY: (
        "histogram",
        (*_BASE, TIER, REASON),
        "Arrival at the replica to the request's end, by how it ended (END_REASONS).",
    ),
    QUEUE_WAIT: ("histogram", (*_BASE, TIER), "Arrival to admission into the running batch."),
    DECODE_TIME: ("histogram", (*_BASE, TIER, REASON), "First token to the request's end."),
    RUNNING_SEQS: ("gauge", (*_BASE, TIER), "Sequences admitted and decoding."),
    WAITING_SEQS: ("gauge", (*_BASE, TIER), "Sequences waiting for admission."),
    KV_USAGE: ("gauge", _BASE, "KV-cache usage (used or reserved blocks), 1 = 100%."),
    PREEMPTIONS: ("counter", _BASE, "Sequences preempted (recomputed) for lack of KV blocks."),
    PROMPT_TOKENS: ("counter", _BASE, "Prompt tokens of admitted requests."),
    GENERATION_TOKENS: ("counter", _BASE, "Generated tokens (rate() = tokens/s)."),
    REQUEST_SUCCESS: ("counter", (*_BASE, REASON), "Finished requests by finish reason."),
    PREFIX_QUERIES: ("counter", _BASE, "Prompt tokens looked up in the prefix cache."),
    PREFIX_HITS: ("counter", _BASE, "Prompt tokens whose KV came from the prefix cache."),
    KV_BLOCKS_USED: ("gauge", _BASE, "KV blocks holding tokens."),
    KV_BLOCKS_RESERVED: ("gauge", _BASE, "KV blocks promised to admitted requests."),
    KV_BLOCKS_TOTAL: ("gauge", _BASE, "KV blocks in the pre-allocated pool."),
    TOKENS_PER_SECOND: ("gauge", _BASE, "Generated tokens per second (rolling window)."),
    CONCURRENCY_LIMIT: ("gauge", _BASE, "Current cap on running sequences."),
    AVG_SEQ_LEN: ("gauge", _BASE, "Average length (tokens) of the running sequences."),
    KV_PRESSURE: (
        "gauge",
        _BASE,
        "running x avg seq len / KV capacity tokens; > 1: the cap is above what KV holds.",
    ),
    KV_PRESSURE_AT_LIMIT: ("gauge", _BASE, "concurrency limit x avg seq len / KV capacity tokens."),
    ENGINE_QUEUE_WAIT_P50: ("gauge", _BASE, "Engine queue wait p50 (rolling window)."),
    ENGINE_QUEUE_WAIT_P99: ("gauge", _BASE, "Engine queue wait p99 (rolling window)."),
    TIMEOUTS: ("counter", _BASE, "Requests that timed out waiting in the engine."),
    REQUESTS: ("counter", (*_BASE, STATUS), f"Requests by outcome at the replica: {STATUSES}."),
    TUNER_MAX_NUM_SEQS: ("gauge", _BASE, "Concurrency ceiling set by the tuner."),
    TUNER_BATCHED_TOKENS: ("gauge", _BASE, "Per-step token budget set by the tuner."),
    TUNER_MOVES: ("counter", (*_BASE, ACTION, KNOB), "Tuner decisions by action and knob."),
    GPU_UTILIZATION: ("gauge", (*_BASE, GPU), "GPU utilization percent (NVML)."),
    GPU_MEMORY_USED: ("gauge", (*_BASE, GPU), "GPU memory used, bytes (NVML)."),
    GPU_MEMORY_TOTAL: ("gauge", (*_BASE, GPU), "GPU memory total, bytes (NVML)."),
    GPU_POWER: ("gauge", (*_BASE, GPU), "GPU power draw, watts (NVML)."),
    STARTUP: ("gauge", (*_BASE, PHASE), "Seconds of this replica's start-up, by phase."),
    LORA_HITS: ("counter", _BASE, "LoRA requests admitted whose adapter already held a slot."),
    LORA_LOADS: ("counter", _BASE, "LoRA adapters loaded into a slot (a miss)."),
    LORA_EVICTIONS: ("counter", _BASE, "LoRA loads that first evicted another adapter (LRU)."),
    LORA_SLOTS_USED: ("gauge", _BASE, "LoRA slots holding an adapter."),
    LORA_SLOTS_TOTAL: ("gauge", _BASE, "LoRA slots (engine.max_loras; 0: no adapters)."),
}


def kv_pressure(num_running: int, avg_seq_len_tokens: float, kv_capacity_tokens: int) -> float:
    """running x average sequence length / KV capacity tokens (R10 early warning, see module)."""
    if num_running < 0:
        raise ValueError(f"num_running={num_running!r} must be >= 0")
    if not avg_seq_len_tokens >= 0:  # also rejects NaN
        raise ValueError(f"avg_seq_len_tokens={avg_seq_len_tokens!r} must be >= 0")
    if kv_capacity_tokens <= 0:
        raise ValueError(f"kv_capacity_tokens={kv_capacity_tokens!r} must be > 0")
    return num_running * avg_seq_len_tokens / kv_capacity_tokens


def engine_gauges(stats: EngineStats, avg_seq_len_tokens: float) -> dict[str, float]:
    """Pool-level gauge values of one engine snapshot (per-tier counts are separate)."""
    capacity_tokens = stats.num_kv_blocks_total * stats.block_size_tokens
    return {
        KV_USAGE: stats.kv_use_fraction,
        KV_BLOCKS_USED: stats.num_kv_blocks_used,
        KV_BLOCKS_RESERVED: stats.num_kv_blocks_reserved,
        KV_BLOCKS_TOTAL: stats.num_kv_blocks_total,
        TOKENS_PER_SECOND: stats.tokens_per_s,
        CONCURRENCY_LIMIT: stats.concurrency_limit,
        AVG_SEQ_LEN: avg_seq_len_tokens,
        KV_PRESSURE: kv_pressure(stats.num_running, avg_seq_len_tokens, capacity_tokens),
        KV_PRESSURE_AT_LIMIT: kv_pressure(
            stats.concurrency_limit, avg_seq_len_tokens, capacity_tokens
        ),
        ENGINE_QUEUE_WAIT_P50: stats.queue_wait_p50_s,
        ENGINE_QUEUE_WAIT_P99: stats.queue_wait_p99_s,
        LORA_SLOTS_USED: len(stats.lora_in_slots),
        LORA_SLOTS_TOTAL: stats.lora_slots_total,
    }


def _check_duration(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name}: duration {value!r} must be a finite number >= 0")


class ReplicaMetrics:
    """The metric objects of one replica, created once; every value carries the pool tag and
    the served model's name (vLLM's `model_name` label).

    Works outside a replica and without `ray.init` (Ray then records nowhere), so the replica
    can build it unconditionally. `factory` is for tests.
    """

    def __init__(
        self, pool: str, model_name: str = "", *, factory: MetricFactory = serve_metric
    ) -> None:
        if not isinstance(pool, str) or not pool:
            raise ValueError(f"pool={pool!r} must be a non-empty string")
        self.pool = pool
        self._metrics: dict[str, Any] = {}
        for name, (kind, tag_keys, description) in METRICS.items():
            boundaries = LATENCY_BUCKETS_S if kind == "histogram" else None
            metric = factory(kind, name, description, tag_keys, boundaries)
            # Serve's set_default_tags returns None (Ray's returns self): do not chain it.
            metric.set_default_tags({POOL: pool, MODEL: model_name})  # a fresh dict each
            self._metrics[name] = metric
        self._seen_tiers: set[str] = set()
        self._last_counts: dict[str, int] = {}

    def observe_first_token(self, tier: str, ttft_s: float, queue_wait_s: float | None) -> None:
        """A request's first token: its TTFT, and its queue wait where the engine measured one."""
        for name, value in ((TTFT, ttft_s), (QUEUE_WAIT, queue_wait_s)):
            if value is None:
                continue
            _check_duration(name, value)
            self._metrics[name].observe(float(value), tags={TIER: tier})

    def observe_end(self, tier: str, e2e_s: float, ttft_s: float | None, reason: str) -> None:
        """A request's end, whatever it was (END_REASONS): end-to-end, and the decode time if a
        first token came; an engine finish also counts in vllm_request_success."""
        if reason not in END_REASONS:
            raise ValueError(f"reason={reason!r} is not one of {list(END_REASONS)}")
        durations = [(E2E_LATENCY, e2e_s)]
        if ttft_s is not None:
            durations.append((DECODE_TIME, max(0.0, e2e_s - ttft_s)))
        for name, value in durations:
            _check_duration(name, value)
            self._metrics[name].observe(float(value), tags={TIER: tier, REASON: reason})
        if reason in FINISH_REASONS:
            self._metrics[REQUEST_SUCCESS].inc(1.0, tags={REASON: reason})

    def count_request(self, status: str) -> None:
        """How a request ended at this replica (one of STATUSES)."""
        if status not in STATUSES:
            raise ValueError(f"status={status!r} is not one of {list(STATUSES)}")
        self._metrics[REQUESTS].inc(1.0, tags={STATUS: status})

    def count_tokens(self, num_prompt: int, num_generated: int) -> None:
        if num_prompt > 0:
            self._metrics[PROMPT_TOKENS].inc(float(num_prompt))
        if num_generated > 0:
            self._metrics[GENERATION_TOKENS].inc(float(num_generated))

    def tuner_move(self, move: Any) -> None:
        """A tuner decision (serving/engine/tuner.py Move): the knobs now, and the count."""
        self._metrics[TUNER_MAX_NUM_SEQS].set(float(move.max_num_seqs))
        self._metrics[TUNER_BATCHED_TOKENS].set(float(move.max_batched_tokens))
        tags = {ACTION: move.action, KNOB: move.knob or "none"}
        self._metrics[TUNER_MOVES].inc(1.0, tags=tags)

    def record_startup(self, startup: StartupPhases) -> None:
        """The constructor's phases (serving/llm/startup.py), set once when the replica is ready."""
        for phase, seconds in startup.as_dict().items():
            self._metrics[STARTUP].set(float(seconds), tags={PHASE: phase})

    def update_engine(self, stats: EngineStats, avg_seq_len_tokens: float) -> None:
        """Set the gauges from one engine snapshot; add the new preemptions and timeouts."""
        for name, value in engine_gauges(stats, avg_seq_len_tokens).items():
            self._metrics[name].set(float(value))
        self._set_per_tier(RUNNING_SEQS, stats.running_by_tier)
        self._set_per_tier(WAITING_SEQS, stats.waiting_by_tier)
        self._add_delta(PREEMPTIONS, stats.num_preemptions)
        self._add_delta(PREFIX_QUERIES, stats.prefix_cache_query_tokens)
        self._add_delta(PREFIX_HITS, stats.prefix_cache_hit_tokens)
        self._add_delta(TIMEOUTS, stats.num_timeouts)
        self._add_delta(LORA_HITS, stats.num_lora_hits)
        self._add_delta(LORA_LOADS, stats.num_lora_loads)
        self._add_delta(LORA_EVICTIONS, stats.num_lora_evictions)

    def update_gpus(self, samples: Iterable[GpuSample] | None = None) -> list[GpuSample]:
        """Set the GPU gauges from `samples` (default: probe the GPUs this process was given)."""
        if samples is None:
            from capacity.probe import probe_gpus

            samples = probe_gpus(visible_only=True)
        samples = list(samples)
        for s in samples:
            tags = {GPU: str(s.index)}
            if not math.isnan(s.utilization_pct):  # NVML cannot read it on some devices
                self._metrics[GPU_UTILIZATION].set(float(s.utilization_pct), tags=tags)
            if not math.isnan(s.power_w):
                self._metrics[GPU_POWER].set(float(s.power_w), tags=tags)
            self._metrics[GPU_MEMORY_USED].set(float(s.memory_used_bytes), tags=tags)
            self._metrics[GPU_MEMORY_TOTAL].set(float(s.memory_total_bytes), tags=tags)
        return samples

    def _set_per_tier(self, name: str, by_tier: Mapping[str, int]) -> None:
        # A tier that emptied must read 0, not keep its last count.
        self._seen_tiers.update(by_tier)
        for tier in sorted(self._seen_tiers):
            self._metrics[name].set(float(by_tier.get(tier, 0)), tags={TIER: tier})

    def _add_delta(self, name: str, cumulative: int) -> None:
        """Counters take increments; the engine reports running totals."""
        last = self._last_counts.get(name, 0)
        if cumulative > last:
            self._metrics[name].inc(float(cumulative - last))
        self._last_counts[name] = cumulative  # a lower total means a new engine: restart from it
