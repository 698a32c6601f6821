"""Replica admission (serving/llm/admission.py): refuse rather than queue without bound."""

from __future__ import annotations

from serving.engine import EngineStats
from serving.llm.admission import admit


def stats(waiting=None, running=None, used=0, reserved=0, limit=8, wait_p50=0.0) -> EngineStats:
    zero = {"interactive": 0, "analytical": 0, "offline": 0}
    return EngineStats(
        running_by_tier={**zero, **(running or {})},
        waiting_by_tier={**zero, **(waiting or {})},
        num_kv_blocks_total=100,
        num_kv_blocks_used=used,
        num_kv_blocks_reserved=reserved,
        block_size_tokens=16,
        concurrency_limit=limit,
        tokens_per_s=0.0,
        queue_wait_p50_s=wait_p50,
        queue_wait_p99_s=wait_p50,
        num_preemptions=0,
        num_finished=0,
        num_timeouts=0,
    )


def decide(s, tier="interactive", ttft=1.0, max_waiting=4, idle=0.5):
    return admit(s, tier, ttft, max_waiting, idle, retry_after_s=2.0)


def test_idle_replica_admits():
    assert decide(stats()).admitted


def test_full_tier_queue_refuses_with_retry_after():
    d = decide(stats(waiting={"interactive": 4}))
    assert not d.admitted and "interactive queue full (4 waiting)" in d.reason
    assert d.retry_after_s == 2.0
    assert decide(stats(waiting={"analytical": 4})).admitted  # other tiers' queues don't count


def test_queue_wait_beyond_half_the_ttft_slo_refuses_only_while_a_queue_exists():
    busy = stats(waiting={"interactive": 1}, wait_p50=0.6)
    d = decide(busy, ttft=1.0)
    assert not d.admitted and "exceeds half the interactive TTFT SLO" in d.reason
    assert decide(busy, ttft=2.0).admitted  # 0.6 s < 1.0 s
    # A backlog of a lower tier is not ahead of interactive: the scheduler admits it first.
    assert decide(stats(waiting={"offline": 50}, wait_p50=0.6), ttft=1.0).admitted
    assert not decide(stats(waiting={"interactive": 1}, wait_p50=0.6), "offline", 1.0).admitted
    # A stale slow wait from an earlier burst does not refuse once the queue has drained.
    assert decide(stats(wait_p50=5.0, running={"interactive": 2})).admitted
    # At the concurrency limit with no queue yet, the next request would wait: refuse.
    assert not decide(stats(wait_p50=5.0, running={"interactive": 8})).admitted


def test_each_tier_is_judged_by_its_own_queue_wait():
    from dataclasses import replace

    slow_offline = replace(
        stats(waiting={"interactive": 1, "offline": 9}, wait_p50=30.0),
        queue_wait_p50_by_tier={"interactive": 0.05, "offline": 30.0},
    )
    assert decide(slow_offline, "interactive", ttft=1.0).admitted
    assert not decide(slow_offline, "offline", ttft=1.0).admitted


def test_offline_needs_idle_kv_headroom():
    assert decide(stats(reserved=40), tier="offline").admitted
    d = decide(stats(reserved=50), tier="offline")
    assert not d.admitted and "no idle KV headroom" in d.reason and d.retry_after_s >= 10
    assert decide(stats(reserved=90), tier="interactive").admitted


def test_lower_tiers_may_fill_only_half_of_the_replicas_serve_slots():
    from serving.llm.admission import max_in_replica

    assert max_in_replica("interactive", 64) == 64 and max_in_replica("offline", 64) == 32
    half_full = stats(waiting={"offline": 28}, running={"offline": 2, "interactive": 2})
    d = admit(half_full, "offline", 600.0, 1024, 0.5, 2.0, max_in_replica("offline", 64))
    assert not d.admitted and "replica holds 32 requests" in d.reason
    interactive = admit(
        half_full, "interactive", 1.0, 64, 0.5, 2.0, max_in_replica("interactive", 64)
    )
    assert interactive.admitted
