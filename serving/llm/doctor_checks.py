"""The four checks of `tideserve doctor` (serving/llm/doctor.py), each a pure function of readings.

Thresholds are R7/R10's: memory watermark 85%, queue wait past half the TTFT SLO. A knob is
suggested only where raising it pays: room in KV, room in the steps (inter-token p99 under half
its SLO) and a step-cost line that predicts >= 20% more tokens/s from a batch twice as big.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capacity.memory import blocks_for_tokens
from serving.llm.messages import ReplicaReading

WATERMARK = 0.85  # R7: a healthy memory watermark stays at or below 85%
QUEUE_SHARE = 0.5  # R10: queue wait past half the latency budget
BOUND_SHARE = 0.25  # a limit binds when admission stopped on it in this share of steps
MIN_GAIN = 1.2  # a bigger batch must promise this much more throughput to be worth it
_MIB = 1024**2


@dataclass(frozen=True, slots=True)
class Finding:
    check: str  # config | memory | queue | compute
    status: str  # ok | warn | fail
    cause: str
    summary: str
    knob: str | None = None
    change: str | None = None
    evidence: tuple[str, ...] = ()


def kv_fit(r: ReplicaReading) -> tuple[float, int]:
    """(average request tokens, how many such requests the whole KV budget holds)."""
    avg = r.window.avg_request_tokens if r.window is not None else 0.0
    avg = avg or r.avg_seq_len_tokens
    if avg <= 0:
        return 0.0, r.kv_blocks_total
    return avg, r.kv_blocks_total // blocks_for_tokens(math.ceil(avg), r.block_size_tokens)


def worst_ratio(r: ReplicaReading, p99_by_tier: Mapping[str, float], slo: str) -> float:
    ratios = [
        p99 / getattr(r.config.tiers[tier], slo)
        for tier, p99 in p99_by_tier.items()
        if tier in r.config.tiers and getattr(r.config.tiers[tier], slo)
    ]
    return max(ratios, default=0.0)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


# --- config --------------------------------------------------------------------------------------


def check_config(readings: Sequence[ReplicaReading]) -> Finding:
    by_print: dict[str, ReplicaReading] = {}
    for r in sorted(readings, key=lambda r: r.pool != "hot"):  # hot is the reference
        by_print.setdefault(r.fingerprint, r)
    ref = next(iter(by_print.values()))
    if len(by_print) == 1:
        return Finding("config", "ok", "consistent", f"one config ({ref.fingerprint[:12]})")
    base = _flatten(ref.config.replica_args())
    evidence, keys = [], []
    for r in list(by_print.values())[1:]:
        other = _flatten(r.config.replica_args())
        for key in sorted(set(base) | set(other)):
            if base.get(key) != other.get(key):
                keys.append(key)
                evidence.append(f"{key}: {ref.pool} {base.get(key)!r}, {r.pool} {other.get(key)!r}")
    drifted = sorted({r.pool for r in by_print.values()} - {ref.pool})
    summary = (
        f"{ref.pool} and {'/'.join(drifted)} run different configs (R9): {', '.join(keys)}; "
        "fix config consistency before capacity"
    )
    change = f"redeploy from cluster.yaml so {'/'.join(drifted)} matches {ref.pool}"
    return Finding(
        "config", "fail", "config_drift", summary, f"pools.{drifted[0]}", change, tuple(evidence)
    )


# --- memory --------------------------------------------------------------------------------------


def _memory_of(r: ReplicaReading) -> tuple[float, Finding]:
    avg, fits = kv_fit(r)
    cap, ceiling = r.kv_capacity_tokens, r.max_num_seqs
    pressure = ceiling * avg / cap if cap else 0.0
    w = r.window
    evidence = [
        f"{r.pool}: KV use {r.kv_use_fraction:.0%} of {cap} tokens "
        f"({r.kv_blocks_total} blocks), {r.num_running} running, {r.num_waiting} waiting",
        f"{r.pool}: max_num_seqs {ceiling} x avg request {avg:.0f} tokens = "
        f"{ceiling * avg:.0f} tokens ({pressure:.2f}x the KV capacity; R10's OOM early warning)",
    ]
    evidence += [
        f"{r.pool}: GPU {g.index} memory {g.memory_used_bytes / g.memory_total_bytes:.0%} used"
        for g in r.gpus
        if g.memory_total_bytes
    ]
    kv_bound = w is not None and w.kv_bound >= BOUND_SHARE
    queued_on_kv = r.num_waiting > 0 and r.kv_use_fraction >= 0.5
    symptoms = kv_bound or queued_on_kv or r.kv_use_fraction >= WATERMARK
    if pressure > 1.0 and symptoms:
        need = ceiling * blocks_for_tokens(math.ceil(avg), r.block_size_tokens)
        need_bytes = need * r.block_size_tokens * r.kv_bytes_per_token
        have_bytes = r.kv_blocks_total * r.block_size_tokens * r.kv_bytes_per_token
        evidence.append(
            f"or raise engine.kv_cache_bytes {have_bytes / _MIB:.1f} MiB -> "
            f"{need_bytes / _MIB:.1f} MiB to hold max_num_seqs requests of that size"
        )
        summary = (
            f"KV budget too small for the concurrency: the cap admits {ceiling} sequences but "
            f"the KV cache holds {fits} of the average {avg:.0f} tokens"
        )
        change = f"{ceiling} -> {max(1, fits)}"
        finding = Finding(
            "memory", "fail", "kv_budget", summary, "engine.max_num_seqs", change, tuple(evidence)
        )
        return pressure, finding
    if pressure > 1.0 or r.kv_use_fraction >= WATERMARK:
        summary = f"KV use {r.kv_use_fraction:.0%}, cap x average {pressure:.2f}x the KV capacity"
        return pressure, Finding(
            "memory", "warn", "kv_watermark", summary, None, None, tuple(evidence)
        )
    summary = f"KV use {r.kv_use_fraction:.0%}; cap x average {pressure:.2f}x the KV capacity"
    return pressure, Finding("memory", "ok", "kv_ok", summary, None, None, tuple(evidence))


def check_memory(readings: Sequence[ReplicaReading]) -> Finding:
    rank = {"fail": 2, "warn": 1, "ok": 0}
    scored = [_memory_of(r) for r in readings]
    return max(scored, key=lambda pf: (rank[pf[1].status], pf[0]))[1]


# --- queue ---------------------------------------------------------------------------------------


def check_queue(readings: Sequence[ReplicaReading]) -> Finding:
    measured = [r for r in readings if r.window is not None and r.window.span_s > 0]
    if not measured:
        return Finding("queue", "ok", "no_window", "no step window closed yet (no traffic)")
    ratios = {id(r): worst_ratio(r, r.window.queue_wait_p99_s, "ttft_p99_s") for r in measured}
    refused = sum(r.refused_per_s for r in measured)
    arrivals = sum(r.window.arrivals_per_s for r in measured) + refused  # demand, turned away too
    done = sum(r.window.completions_per_s for r in measured)
    growth = sum(r.window.waiting_end - r.window.waiting_start for r in measured)
    waiting = sum(r.num_waiting for r in measured)
    growing = (growth > 0 and waiting > 0 and arrivals > 1.05 * done) or refused > 0
    worst = max(measured, key=lambda r: (ratios[id(r)], r.num_waiting))
    evidence = (
        f"queue wait p99 {max(ratios.values()):.2f}x the TTFT SLO (R10 line: {QUEUE_SHARE}x)",
        f"arrivals {arrivals:.2f}/s (of which refused {refused:.2f}/s), completions "
        f"{done:.2f}/s, waiting {waiting} ({growth:+d} over the window)",
    )
    if ratios[id(worst)] <= QUEUE_SHARE and not growing:
        return Finding(
            "queue", "ok", "queue_ok", "queue wait within half the SLO", None, None, evidence
        )
    return _queue_cause(worst, measured, arrivals, evidence)


def _queue_cause(r, measured, arrivals, evidence) -> Finding:
    w = r.window
    _, fits = kv_fit(r)
    gain = w.throughput_gain(2.0)
    room = worst_ratio(r, w.itl_p99_s, "itl_p99_s") < QUEUE_SHARE and (gain or 0) >= MIN_GAIN
    evidence += (
        f"{r.pool}: admission stopped at max_num_seqs in {w.ceiling_bound:.0%} of steps, on the "
        f"token budget in {w.budget_bound:.0%}, busy {w.busy_fraction:.0%}",
        f"{r.pool}: step = {w.step_fixed_s * 1e3:.1f} ms + {w.step_per_token_s * 1e3:.3f} ms/token"
        f" at {w.mean_tokens_per_step:.0f} tokens; 2x batch -> "
        + ("?" if gain is None else f"{gain:.2f}x tokens/s"),
    )
    c, b = r.max_num_seqs, r.max_num_batched_tokens
    if room and w.ceiling_bound >= BOUND_SHARE and fits > c:
        summary = "requests queue at the concurrency cap while KV and the steps have room"
        change = f"{c} -> {min(2 * c, fits)}"
        return Finding(
            "queue", "fail", "concurrency_cap", summary, "engine.max_num_seqs", change, evidence
        )
    if room and w.budget_bound >= BOUND_SHARE:
        summary = "requests queue on the per-step token budget while the steps have room"
        knob = "engine.max_num_batched_tokens"
        return Finding("queue", "fail", "token_budget", summary, knob, f"{b} -> {2 * b}", evidence)
    per_replica = [
        x.window.completions_per_s / x.window.busy_fraction
        for x in measured
        if x.window.num_completions and x.window.busy_fraction > 0
    ]
    n = len(measured)
    if per_replica:
        serve_rate = sum(per_replica) / len(per_replica)
        add = max(1, math.ceil(arrivals / serve_rate) - n)
        rate = f"{serve_rate:.2f}/s per busy replica"
    else:
        add, rate = 1, "no completion measured"
    summary = (
        f"arrivals {arrivals:.2f}/s exceed what {n} replica(s) complete ({rate}): the queue "
        "grows; add replicas, not a smaller batch"
    )
    change = f"+{add} ({n} -> {n + add})"
    return Finding(
        "queue",
        "fail",
        "arrivals_exceed_capacity",
        summary,
        "pools.hot.num_replicas",
        change,
        evidence,
    )


# --- compute -------------------------------------------------------------------------------------


def prefix_cache_evidence(readings: Sequence[ReplicaReading]) -> tuple[str, ...]:
    """The prefix cache's hit rate per pool: the share of prompt tokens not prefilled."""
    lines = []
    for pool in sorted({r.pool for r in readings}):
        queried = sum(r.prefix_cache_query_tokens for r in readings if r.pool == pool)
        hits = sum(r.prefix_cache_hit_tokens for r in readings if r.pool == pool)
        if queried:
            lines.append(
                f"{pool}: prefix cache hit rate {hits / queried:.0%} ({hits} of {queried} "
                "prompt tokens not prefilled)"
            )
    return tuple(lines)


def check_compute(readings: Sequence[ReplicaReading]) -> Finding:
    measured = [r for r in readings if r.window is not None and r.window.itl_p99_s]
    evidence = tuple(
        f"{r.pool}: GPU {g.index} utilisation {g.utilization_pct:.0f}% (R7 healthy band 50-70%)"
        for r in readings
        for g in r.gpus
        if not math.isnan(g.utilization_pct)
    ) + prefix_cache_evidence(readings)
    if not measured:
        return Finding(
            "compute", "ok", "no_window", "no inter-token gaps measured yet", None, None, evidence
        )
    r = max(measured, key=lambda x: worst_ratio(x, x.window.itl_p99_s, "itl_p99_s"))
    ratio, w = worst_ratio(r, r.window.itl_p99_s, "itl_p99_s"), r.window
    evidence += (
        f"{r.pool}: inter-token p99 {ratio:.2f}x its SLO; prefill {w.prefill_fraction:.0%} of "
        f"scheduled tokens, {w.mean_tokens_per_step:.0f} tokens per step",
    )
    if ratio <= 1.0:
        return Finding(
            "compute", "ok", "compute_ok", "inter-token p99 within its SLO", None, None, evidence
        )
    if w.prefill_fraction >= 0.5:
        knob, now_v = "engine.max_num_batched_tokens", r.max_num_batched_tokens
    else:
        knob, now_v = "engine.max_num_seqs", r.max_num_seqs
    summary = "steps too long for the inter-token SLO: the batch is too big"
    return Finding(
        "compute",
        "fail",
        "batch_too_big",
        summary,
        knob,
        f"{now_v} -> {max(1, now_v // 2)}",
        evidence,
    )
