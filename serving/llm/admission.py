"""Replica-level admission: may this replica take one more request of a tier? Pure, no Ray.

A replica refuses rather than queue without bound, so the ingress can try the other pool and,
when every eligible pool refuses, answer 429 with Retry-After (R8: queue or degrade, never OOM).

  queue full         waiting in the tier >= max_waiting
  too slow           the tier's recent queue wait, while a queue exists ahead of it (its own
                     tier or a higher one, or every slot taken), exceeds half the TTFT SLO (R10:
                     "if queue wait exceeds half the latency budget" the replica is saturated);
                     lower tiers' backlogs do not count, the scheduler admits this tier first
  not idle (offline) offline work only lands where KV use is below the idle fraction (R5)
  no slot left       the replica already holds `max_in_replica` requests (running + waiting);
                     lower tiers get half of Serve's max_ongoing_requests, so a backlog of them
                     never fills the replica and parks interactive requests in Serve's FIFO
                     queue in front of it, where priority cannot help
"""

from __future__ import annotations

from dataclasses import dataclass

from common.tiers import tiers_up_to
from serving.engine import EngineStats


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    reason: str = ""
    retry_after_s: float = 0.0


ADMIT = Admission(True)


def max_in_replica(tier: str, max_ongoing_requests: int) -> int:
    """Requests a replica may hold when one of `tier` arrives: all of Serve's slots for
    interactive, half for the tiers below it."""
    return max_ongoing_requests if tier == "interactive" else max(1, max_ongoing_requests // 2)


def admit(
    stats: EngineStats,
    tier: str,
    ttft_p99_s: float,
    max_waiting: int,
    offline_idle_fraction: float,
    retry_after_s: float,
    max_in_replica: int | None = None,
) -> Admission:
    held = stats.num_running + stats.num_waiting
    if max_in_replica is not None and held >= max_in_replica:
        return Admission(
            False, f"replica holds {held} requests, the {tier} limit is {max_in_replica}",
            retry_after_s,
        )  # fmt: skip
    waiting = stats.waiting_by_tier.get(tier, 0)
    if waiting >= max_waiting:
        return Admission(False, f"{tier} queue full ({waiting} waiting)", retry_after_s)
    if tier == "offline" and stats.kv_use_fraction >= offline_idle_fraction:
        return Admission(
            False,
            f"no idle KV headroom for offline work (KV use {stats.kv_use_fraction:.0%} >= "
            f"{offline_idle_fraction:.0%})",
            max(retry_after_s, 10.0),
        )
    ahead = tiers_up_to(tier)  # the scheduler admits these before this tier's next request
    queued = (
        any(stats.waiting_by_tier.get(t, 0) > 0 for t in ahead)
        or stats.num_running >= stats.concurrency_limit
    )
    wait_s = stats.queue_wait_p50_by_tier.get(tier, stats.queue_wait_p50_s)
    if queued and wait_s > ttft_p99_s / 2:
        return Admission(
            False,
            f"queue wait {wait_s:.2f} s exceeds half the {tier} TTFT SLO ({ttft_p99_s:.2f} s)",
            retry_after_s,
        )
    return ADMIT
