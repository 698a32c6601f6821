"""Replica-level admission: may this replica take one more request of a tier? Pure, no Ray.

A replica refuses rather than queue without bound, so the ingress can try the other pool and,
when every eligible pool refuses, answer 429 with Retry-After (R8: queue or degrade, never OOM).

  queue full         waiting in the tier >= max_waiting
  too slow           the recent queue wait, while a queue exists, exceeds half the TTFT SLO
                     (R10: "if queue wait exceeds half the latency budget" the replica is saturated)
  not idle (offline) offline work only lands where KV use is below the idle fraction (R5)
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.engine import EngineStats


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    reason: str = ""
    retry_after_s: float = 0.0


ADMIT = Admission(True)


def admit(
    stats: EngineStats,
    tier: str,
    ttft_p99_s: float,
    max_waiting: int,
    offline_idle_fraction: float,
    retry_after_s: float,
) -> Admission:
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
    queued = stats.num_waiting > 0 or stats.num_running >= stats.concurrency_limit
    if queued and stats.queue_wait_p50_s > ttft_p99_s / 2:
        return Admission(
            False,
            f"queue wait {stats.queue_wait_p50_s:.2f} s exceeds half the {tier} TTFT SLO "
            f"({ttft_p99_s:.2f} s)",
            retry_after_s,
        )
    return ADMIT
