"""Replica admission (serving/llm/admission.py): admit only what the predicted TTFT lets meet
its SLO; refuse with the tier, the prediction and a Retry-After from it. Constructed stats."""

from __future__ import annotations

import pytest

from serving.engine import EngineStats
from serving.engine.load import LoadSnapshot, QueueSummary
from serving.llm.admission import (
    RETRY_AFTER_MIN_S,
    AdmissionLimits,
    admit,
    bounded_retry_after,
    max_in_replica,
)
from serving.llm.ttft import predict_ttft

STEP_S = 0.02  # a full decode step of the snapshots below: 0.01 + 0.005 x 2 slots


def stats(waiting=None, running=None, used=0, reserved=0, limit=2) -> EngineStats:
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
        queue_wait_p50_s=0.0,
        queue_wait_p99_s=0.0,
        num_preemptions=0,
        num_finished=0,
        num_timeouts=0,
    )


def load(running=(), waiting=None, slots=2) -> LoadSnapshot:
    return LoadSnapshot(
        taken_s=50.0,
        step_fixed_s=0.01,
        step_per_token_s=0.005,
        max_batched_tokens=256,
        slots=slots,
        running_remaining_tokens=running,
        waiting=waiting or {},
    )


def limits(budget=0.5, max_waiting=4, idle=0.5, held=None, cap=60.0) -> AdmissionLimits:
    return AdmissionLimits(budget, max_waiting, idle, held, cap)


def test_idle_replica_admits_and_says_what_it_predicted():
    d = admit(stats(), load(), "interactive", 8, limits(), now=50.0)
    assert d.admitted and 0 < d.predicted_ttft_s < 0.2


def test_a_free_slot_admits_even_a_request_whose_prefill_alone_exceeds_the_budget():
    d = admit(stats(), load(), "interactive", 200, limits(budget=0.01), now=50.0)
    assert d.admitted  # nothing is ahead of it: refusing would not make it faster


def test_predicted_ttft_over_the_budget_refuses_naming_tier_and_wait():
    # Both slots busy for 40 more tokens (0.8 s at 20 ms a step): an interactive request would
    # wait 0.8 s for a slot, over a 0.5 s budget.
    busy_stats, busy = stats(running={"interactive": 2}), load(running=(40, 60))
    d = admit(busy_stats, busy, "interactive", 8, limits(budget=0.5), now=50.0)
    assert not d.admitted
    assert d.reason.startswith("interactive: predicted TTFT")
    assert "waiting for a slot" in d.reason and "0.50 s" in d.reason
    expected = predict_ttft(busy, "interactive", 8, 50.0)
    assert d.predicted_ttft_s == pytest.approx(expected.ttft_s)
    # Retry-After: when the prediction is back under the budget (here < 1 s: the header floor).
    assert d.retry_after_s == RETRY_AFTER_MIN_S
    # The same replica admits once enough time has passed for the first slot to near its end.
    assert admit(busy_stats, busy, "interactive", 8, limits(budget=0.5), now=50.5).admitted
    # ...and admits at once under a budget that holds the wait.
    assert admit(busy_stats, busy, "interactive", 8, limits(budget=1.0), now=50.0).admitted


def test_under_overload_a_request_that_would_wait_longer_than_its_bound_is_refused():
    # Both slots free in 0.2 s (10 tokens at 20 ms): the TTFT fits a 0.5 s budget, but with the
    # ingress turning 30 requests/s away, one of them takes a freed slot within 0.067 s.
    busy_stats, busy = stats(running={"interactive": 2}), load(running=(10, 12))
    bounded = AdmissionLimits(0.5, 4, 0.5, None, 60.0, max_wait_s=2 / 30)
    d = admit(busy_stats, busy, "interactive", 8, bounded, now=50.0)
    assert not d.admitted
    assert d.reason.startswith("interactive: predicted wait 0.20 s for a slot exceeds 0.07 s:")
    assert d.retry_after_s == RETRY_AFTER_MIN_S  # the slot frees within a second
    assert admit(busy_stats, busy, "interactive", 8, limits(budget=0.5), now=50.0).admitted
    # Once the slot is about to free, the wait fits the bound and the request is admitted...
    assert admit(busy_stats, busy, "interactive", 8, bounded, now=50.15).admitted
    # ...and a free slot admits whatever the bound.
    zero_wait = AdmissionLimits(0.5, 4, 0.5, None, 60.0, max_wait_s=0.0)
    assert admit(stats(), load(), "interactive", 8, zero_wait, now=50.0).admitted


def test_retry_after_is_the_predicted_time_until_capacity_frees_bounded():
    busy_stats = stats(running={"interactive": 2}, waiting={"interactive": 3})
    queued = {"interactive": QueueSummary(3, 8, 100)}
    busy = load(running=(200, 200), waiting=queued)
    d = admit(busy_stats, busy, "interactive", 8, limits(budget=0.5, max_waiting=8), now=50.0)
    p = predict_ttft(busy, "interactive", 8, 50.0)
    assert not d.admitted and p.ttft_s > 5
    assert d.retry_after_s == pytest.approx(p.ttft_s - 0.5)  # not a constant: the prediction
    capped = admit(busy_stats, busy, "interactive", 8, limits(max_waiting=8, cap=3.0), 50.0)
    assert capped.retry_after_s == 3.0
    assert bounded_retry_after(0.2, 60.0) == RETRY_AFTER_MIN_S
    assert bounded_retry_after(500.0, 60.0) == 60.0


def test_work_of_lower_tiers_is_not_ahead_of_interactive():
    flood = {"offline": QueueSummary(50, 40, 96)}
    s = stats(running={"offline": 1}, waiting={"offline": 50})
    d = admit(s, load(running=(90,), waiting=flood), "interactive", 8, limits(), now=50.0)
    assert d.admitted
    off = admit(s, load(running=(90,), waiting=flood), "offline", 8, limits(1.0, 64), 50.0)
    assert not off.admitted and off.reason.startswith("offline: predicted TTFT")


def test_full_tier_queue_refuses_with_a_predicted_retry_after():
    d = admit(stats(waiting={"interactive": 4}), load(), "interactive", 8, limits(), now=50.0)
    assert not d.admitted and "interactive: queue full (4 waiting)" in d.reason
    assert d.retry_after_s >= RETRY_AFTER_MIN_S
    other_tier_full = stats(waiting={"analytical": 4})
    assert admit(other_tier_full, load(), "interactive", 8, limits(), 50.0).admitted


def test_offline_needs_idle_kv_headroom():
    assert admit(stats(reserved=40), load(), "offline", 8, limits(600.0), 50.0).admitted
    d = admit(stats(reserved=50), load(), "offline", 8, limits(600.0), 50.0)
    assert not d.admitted and "no idle KV headroom" in d.reason and d.retry_after_s >= 10
    assert admit(stats(reserved=90), load(), "interactive", 8, limits(), 50.0).admitted


def test_lower_tiers_may_fill_only_half_of_the_replicas_serve_slots():
    assert max_in_replica("interactive", 64) == 64 and max_in_replica("offline", 64) == 32
    half_full = stats(waiting={"offline": 28}, running={"offline": 2, "interactive": 2}, limit=8)
    offline = limits(600.0, 1024, held=max_in_replica("offline", 64))
    d = admit(half_full, load(slots=8), "offline", 8, offline, 50.0)
    assert not d.admitted and "replica holds 32 requests" in d.reason
    interactive = limits(60.0, 64, held=max_in_replica("interactive", 64))
    assert admit(half_full, load(slots=8), "interactive", 8, interactive, 50.0).admitted
