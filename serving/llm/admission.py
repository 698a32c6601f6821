"""Replica-level admission: may this replica take one more request of a tier? Pure, no Ray.

A replica refuses rather than queue a request that would miss its SLO, so the ingress can try
the other pool and, when every eligible pool refuses, answer 429 with Retry-After (R8: queue or
degrade, never OOM; R10: queue wait against the latency budget).

  no slot left       the replica already holds `max_in_replica` requests (running + waiting);
                     lower tiers get half of Serve's max_ongoing_requests, so a backlog of them
                     never fills the replica and parks interactive requests in Serve's FIFO
                     queue in front of it, where priority cannot help
  queue full         waiting in the tier >= max_waiting
  not idle (offline) offline work only lands where KV use is below the idle fraction (R5)
  TTFT would miss    the predicted time to first token (serving/llm/ttft.py: the work queued
                     ahead in this tier and the tiers before it, paced by the engine's measured
                     step cost) exceeds the tier's budget (`ttft_budget_s`: ttft_p99_s less the
                     time spent, less the larger of the fixed share 1 - ttft_admit_fraction
                     and the margin the ingress measured, serving/llm/ttft_margin.py);
                     a request that finds a free slot is always admitted (nothing is ahead of
                     it, so refusing would not make it faster)
  wait too long      (interactive, while the ingress refuses it) the predicted wait for a
                     slot exceeds the bound the ingress sends with the request, the time the
                     next arrivals take at the rate it sees (serving/llm/arrivals.py): more
                     come than the slots take, so the next arrival takes a freed slot anyway,
                     and queueing adds TTFT and no throughput

`judge_ttft` is the last two rules alone; the ingress applies it to a pool's last refused
snapshot to skip that pool until capacity is predicted to free (serving/llm/dispatch.py).

Retry-After is the predicted time until capacity frees for such a request (the TTFT excess
over the budget, or the time until the next slot frees when the limit is a count), bounded to
[RETRY_AFTER_MIN_S, retry_after_max_s]: below 1 s the header cannot say it (whole seconds), and
a prediction far out is a guess that the client should re-check within the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.engine import EngineStats
from serving.engine.load import LoadSnapshot
from serving.llm.ttft import Prediction, predict_ttft

RETRY_AFTER_MIN_S = 1.0
OFFLINE_RETRY_MIN_S = 10.0  # KV headroom for offline work comes back with whole requests


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    ttft_budget_s: float  # `ttft_budget_s` of the request's tier
    max_waiting: int
    offline_idle_fraction: float
    max_in_replica: int | None = None
    retry_after_max_s: float = 60.0
    max_wait_s: float | None = None  # the request's bound on its wait for a slot (None: none)


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    reason: str = ""
    retry_after_s: float = 0.0
    predicted_ttft_s: float = 0.0


def max_in_replica(tier: str, max_ongoing_requests: int) -> int:
    """Requests a replica may hold when one of `tier` arrives: all of Serve's slots for
    interactive, half for the tiers below it."""
    return max_ongoing_requests if tier == "interactive" else max(1, max_ongoing_requests // 2)


def ttft_budget_s(
    ttft_p99_s: float, admit_fraction: float, spent_s: float, margin_s: float | None
) -> float:
    """What a request's predicted TTFT may use: the SLO less the time already spent and a
    margin for what the prediction misses, the larger of the tier's fixed share
    (1 - ttft_admit_fraction) and the margin the ingress measured (serving/llm/ttft_margin.py)."""
    margin = ttft_p99_s * (1.0 - admit_fraction)
    if margin_s is not None:
        margin = max(margin, margin_s)
    return max(ttft_p99_s - spent_s - margin, 0.0)


def bounded_retry_after(free_in_s: float, retry_after_max_s: float) -> float:
    return min(max(free_in_s, RETRY_AFTER_MIN_S), max(retry_after_max_s, RETRY_AFTER_MIN_S))


def judge_ttft(
    prediction: Prediction,
    tier: str,
    budget_s: float,
    retry_after_max_s: float,
    max_wait_s: float | None = None,
) -> Admission:
    """Admit when a slot is free now, or when the predicted TTFT fits the budget and the wait
    for a slot fits `max_wait_s` (None: no bound; serving/llm/arrivals.py)."""
    ttft_s = prediction.ttft_s
    if max_wait_s is not None and prediction.wait_s > max_wait_s:
        return Admission(
            False,
            f"{tier}: predicted wait {prediction.wait_s:.2f} s for a slot exceeds "
            f"{max_wait_s:.2f} s: the ingress is turning {tier} requests away, and the next "
            "arrival takes a freed slot (no standing queue under overload)",
            bounded_retry_after(prediction.next_free_s, retry_after_max_s),
            ttft_s,
        )
    if prediction.wait_s <= 0.0 or ttft_s <= budget_s:
        return Admission(True, predicted_ttft_s=ttft_s)
    return Admission(
        False,
        f"{tier}: predicted TTFT {ttft_s:.2f} s (of it {prediction.wait_s:.2f} s waiting for a "
        f"slot) exceeds the {tier} admission budget {budget_s:.2f} s",
        bounded_retry_after(prediction.free_in_s(budget_s), retry_after_max_s),
        ttft_s,
    )


def admit(
    stats: EngineStats,
    load: LoadSnapshot,
    tier: str,
    prompt_tokens: int,
    limits: AdmissionLimits,
    now: float,
) -> Admission:
    prediction = predict_ttft(load, tier, prompt_tokens, now)
    ttft_s = prediction.ttft_s
    slot_retry_s = bounded_retry_after(prediction.next_free_s, limits.retry_after_max_s)
    held = stats.num_running + stats.num_waiting
    if limits.max_in_replica is not None and held >= limits.max_in_replica:
        limit = limits.max_in_replica
        reason = f"{tier}: replica holds {held} requests, the {tier} limit is {limit}"
        return Admission(False, reason, slot_retry_s, ttft_s)
    waiting = stats.waiting_by_tier.get(tier, 0)
    if waiting >= limits.max_waiting:
        reason = f"{tier}: queue full ({waiting} waiting), predicted TTFT {ttft_s:.2f} s"
        free_in_s = max(prediction.free_in_s(limits.ttft_budget_s), prediction.next_free_s)
        retry_s = bounded_retry_after(free_in_s, limits.retry_after_max_s)
        return Admission(False, reason, retry_s, ttft_s)
    if tier == "offline" and stats.kv_use_fraction >= limits.offline_idle_fraction:
        return Admission(
            False,
            f"offline: no idle KV headroom (KV use {stats.kv_use_fraction:.0%} >= "
            f"{limits.offline_idle_fraction:.0%})",
            max(slot_retry_s, OFFLINE_RETRY_MIN_S),
            ttft_s,
        )
    return judge_ttft(
        prediction, tier, limits.ttft_budget_s, limits.retry_after_max_s, limits.max_wait_s
    )
