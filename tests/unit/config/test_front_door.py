"""The bounded front door (serving/config/front_door.py): bounds follow from pools, capacity
and the tiers' TTFT SLOs; the ingress deployment carries them with Serve's 429 backpressure."""

from __future__ import annotations

import pytest

from serving.config import AppConfig
from serving.config.front_door import front_door


def config(**sections) -> AppConfig:
    base = {
        "pools": {"hot": {"num_replicas": 1}, "cold": {"max_replicas": 2}},
        "controller": {"enabled": False, "replica_capacity_rps": 4.0},
        "replica": {"max_ongoing_requests": 8},
        "engine": {"max_num_seqs": 1, "min_num_seqs": 1},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return AppConfig.from_args(base)


def test_bounds_follow_from_replicas_capacity_and_the_tightest_ttft_budget():
    door = front_door(config())
    assert door.max_ongoing_requests == 3 * 2  # a batch running and one waiting, 3 replicas
    assert door.lower_tier_slots == 3  # half of them
    # the hot replica's 4 req/s drain the queue (cold may be at zero); interactive's budget
    # is 1.0 s x 0.5
    assert door.max_queued_requests == 2
    assert door.retry_after_s == pytest.approx(1.0)  # 2 / 4 req/s = 0.5 s, floored at 1 s


def test_a_tighter_slo_or_less_capacity_shrinks_the_queue():
    tight = config(tiers={"interactive": {"ttft_p99_s": 0.5}})
    assert front_door(tight).max_queued_requests == 1
    slow = config(controller={"enabled": False, "replica_capacity_rps": 0.2})
    door = front_door(slow)
    assert door.max_queued_requests == 1  # never 0: Serve refuses 0
    assert door.retry_after_s == pytest.approx(1 / 0.2)  # a full queue drains in 5 s


def test_the_queue_holds_at_least_a_burst_the_hot_replicas_could_start_at_once():
    # Serve counts requests still being routed as queued: 16 clients arriving together must
    # not get the proxy's 429 while every slot is free.
    burst = config(engine={"max_num_seqs": 32, "min_num_seqs": 8})
    assert front_door(burst).max_queued_requests == 32  # 1 hot replica x 32 sequences > 2


def test_the_ingress_holds_two_batches_per_replica_and_lower_tiers_half_of_it():
    # 16 sequences per replica under Serve's 64 slots: past 16 running and 16 waiting a
    # request would wait at least a whole request's time
    wide = config(replica={"max_ongoing_requests": 64}, engine={"max_num_seqs": 16})
    assert front_door(wide).max_ongoing_requests == 3 * 32
    assert front_door(wide).lower_tier_slots == 48
    # Serve's slots below the engine's: those bound it
    narrow = config(replica={"max_ongoing_requests": 4}, engine={"max_num_seqs": 32})
    assert front_door(narrow).max_ongoing_requests == 12


def test_explicit_bounds_override_and_are_validated():
    door = front_door(
        config(server={"ingress_max_ongoing_requests": 100, "ingress_max_queued_requests": 7})
    )
    assert (door.max_ongoing_requests, door.max_queued_requests) == (100, 7)
    assert door.lower_tier_slots == 50
    with pytest.raises(ValueError, match=r"server\.ingress_max_queued_requests=0"):
        config(server={"ingress_max_queued_requests": 0})


def test_the_ingress_deployment_carries_the_bounds_and_answers_429_with_retry_after():
    from serving.app import _ingress_options

    options = _ingress_options(config())
    assert options["max_ongoing_requests"] == 6 and options["max_queued_requests"] == 2
    backpressure = options["backpressure_config"]
    assert backpressure.status_code == 429 and backpressure.retry_after_s == pytest.approx(1.0)
