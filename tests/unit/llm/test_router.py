"""KV-headroom ranking: pure functions, hand-built stats, no Ray cluster."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from serving.llm.router import (
    ROUTING_STATS_KEYS,
    KVHeadroomRouter,
    headroom_tokens,
    rank_by_headroom,
    routing_stats_from_engine,
)
from tests.conftest import engine_stats


def stats(free: int, queued: int = 0, reserved: int = 0, total: int = 10_000) -> dict[str, int]:
    return {
        "kv_free_tokens": free,
        "kv_reserved_tokens": reserved,
        "kv_total_tokens": total,
        "queued_tokens": queued,
        "num_waiting": 0,
        "num_running": 0,
    }


# ----- headroom formula ---------------------------------------------------------------------------
def test_headroom_is_free_minus_queued():
    assert headroom_tokens(stats(free=5000, queued=1200)) == 3800


def test_headroom_takes_out_reservations_a_reporter_counted_as_free():
    # free counts only used blocks as busy (9000 free) but 4000 tokens are promised: 6000 remain
    assert headroom_tokens(stats(free=9000, reserved=4000, queued=500)) == 5500


def test_headroom_goes_negative_when_the_queue_claims_more_than_is_free():
    assert headroom_tokens(stats(free=100, queued=400)) == -300


@pytest.mark.parametrize("bad", [None, "12", float("nan"), float("inf"), True])
def test_headroom_rejects_non_numbers_naming_the_key(bad):
    s = stats(free=10)
    s["queued_tokens"] = bad
    with pytest.raises(ValueError, match="queued_tokens"):
        headroom_tokens(s)


def test_headroom_names_a_missing_key():
    s = stats(free=10)
    del s["kv_total_tokens"]
    with pytest.raises(ValueError, match="kv_total_tokens"):
        headroom_tokens(s)


# ----- ranking ------------------------------------------------------------------------------------
def test_rank_most_headroom_first():
    ranked = rank_by_headroom([("a", stats(100)), ("b", stats(9000)), ("c", stats(3000))])
    assert ranked == [["b"], ["c"], ["a"]]


def test_queued_tokens_push_a_replica_down():
    ranked = rank_by_headroom([("idle", stats(5000)), ("queued", stats(8000, queued=6000))])
    assert ranked == [["idle"], ["queued"]]


def test_near_equal_headroom_shares_a_rank_in_input_order():
    ranked = rank_by_headroom([("a", stats(950)), ("b", stats(1000)), ("c", stats(100))])
    assert ranked == [["b", "a"], ["c"]]  # 950 is within 10 % of 1000; b leads, a keeps order


def test_ties_are_broken_stably():
    pairs = [(name, stats(500)) for name in "dcab"]
    assert rank_by_headroom(pairs) == [["d", "c", "a", "b"]]
    assert rank_by_headroom(pairs, band_fraction=0.0) == [["d", "c", "a", "b"]]


def test_zero_band_separates_every_distinct_headroom():
    ranked = rank_by_headroom([("a", stats(999)), ("b", stats(1000))], band_fraction=0.0)
    assert ranked == [["b"], ["a"]]


def test_replicas_without_stats_go_in_a_middle_rank():
    pairs = [
        ("low", stats(100)),
        ("new1", {}),
        ("high", stats(9000)),
        ("new2", None),
        ("mid", stats(3000)),
    ]
    assert rank_by_headroom(pairs) == [["high"], ["mid"], ["new1", "new2"], ["low"]]


def test_new_replicas_come_before_saturated_ones():
    pairs = [("full", stats(100, queued=500)), ("new", {}), ("fuller", stats(0, queued=900))]
    assert rank_by_headroom(pairs) == [["new"], ["full", "fuller"]]


def test_new_replica_after_the_only_reporting_replica():
    assert rank_by_headroom([("new", {}), ("old", stats(10))]) == [["old"], ["new"]]


def test_unusable_stats_count_as_no_stats():
    broken = {"kv_free_tokens": 10}  # an older replica reporting another schema
    ranked = rank_by_headroom([("a", stats(100)), ("b", stats(50)), ("broken", broken)])
    assert ranked == [["a"], ["broken"], ["b"]]


def test_all_without_stats_is_one_rank_and_no_replicas_no_ranks():
    assert rank_by_headroom([("a", {}), ("b", {})]) == [["a", "b"]]
    assert rank_by_headroom([]) == []


def test_saturated_replicas_are_ordered_least_negative_first():
    pairs = [("x", stats(0, queued=900)), ("y", stats(0, queued=10))]
    assert rank_by_headroom(pairs) == [["y", "x"]]


@pytest.mark.parametrize("band", [-0.1, 1.0, 2.0])
def test_band_fraction_is_checked(band):
    with pytest.raises(ValueError, match="band_fraction"):
        rank_by_headroom([("a", stats(1))], band_fraction=band)


# ----- stats from the engine ----------------------------------------------------------------------
def test_routing_stats_from_engine():
    out = routing_stats_from_engine(engine_stats(), queued_tokens=96)
    assert set(out) == set(ROUTING_STATS_KEYS)
    assert out == {
        "kv_free_tokens": (100 - 45) * 16,  # reserved (45) > used (30): reservations are busy
        "kv_reserved_tokens": 45 * 16,
        "kv_total_tokens": 100 * 16,
        "queued_tokens": 96,
        "num_waiting": 2,
        "num_running": 4,
    }
    assert headroom_tokens(out) == 55 * 16 - 96


def test_routing_stats_from_engine_on_demand_mode_counts_used_blocks():
    out = routing_stats_from_engine(
        engine_stats(num_kv_blocks_used=80, num_kv_blocks_reserved=0), queued_tokens=0
    )
    assert out["kv_free_tokens"] == 20 * 16
    assert headroom_tokens(out) == 20 * 16


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_routing_stats_from_engine_checks_queued_tokens(bad):
    with pytest.raises(ValueError, match="queued_tokens"):
        routing_stats_from_engine(engine_stats(), queued_tokens=bad)


# ----- the router class, without a cluster ------------------------------------------------------
class FakeReplica:
    def __init__(self, replica_id: str, routing_stats: dict) -> None:
        self.replica_id = replica_id
        self.routing_stats = routing_stats


def make_router() -> KVHeadroomRouter:
    from serving.ray_internals import router_kwargs

    router = KVHeadroomRouter(**router_kwargs("hot", "app"))
    router.initialize_state()
    return router


def test_router_ranks_by_headroom_and_asks_serve_to_back_off():
    router = make_router()
    replicas = [FakeReplica("b", stats(10)), FakeReplica("a", stats(5000)), FakeReplica("n", {})]
    request = SimpleNamespace(routing_context=SimpleNamespace(should_backoff=False))
    ranked = asyncio.run(router.choose_replicas(replicas, request))
    assert [[r.replica_id for r in rank] for rank in ranked] == [["a"], ["n"], ["b"]]
    assert request.routing_context.should_backoff is True
    assert asyncio.run(router.choose_replicas([], None)) == []


def test_router_kwargs_are_checked():
    router = make_router()
    router.initialize_state(band_fraction=0.25)
    assert router.band_fraction == 0.25
    with pytest.raises(ValueError, match="band_fraction"):
        router.initialize_state(band_fraction=1.5)
    with pytest.raises(ValueError, match="bandwidth"):
        router.initialize_state(bandwidth=0.1)


def test_router_importable_by_the_string_serve_uses():
    from ray.serve.config import RequestRouterConfig

    config = RequestRouterConfig(
        request_router_class="serving.llm.router:KVHeadroomRouter",
        request_routing_stats_period_s=0.5,
    )
    assert config.get_request_router_class().__name__ == "KVHeadroomRouter"


# ----- calls that share one HTTP request's id ----------------------------------------------------
def test_prefix_router_routes_every_call_made_inside_one_http_request():
    """The n choices of a chat request (or a batch job's lines) are handle calls that inherit
    their HTTP request's internal id; Serve's exact-match index holds only the first, so without
    the scan the second and third would wait forever (the n=3 hang)."""
    from serving.llm.router import PrefixAffinityRouter
    from serving.ray_internals import pending_request, router_kwargs

    async def scenario() -> list[str]:
        router = PrefixAffinityRouter(**router_kwargs("hot", "app"))
        router.initialize_state()
        choices = [pending_request("shared") for _ in range(3)]
        meta = choices[0].metadata
        for pending in choices:
            router._pending_requests_to_fulfill.append(pending)
            router._add_pending_request_to_indices(pending)
        for name in ("x", "y", "z"):
            router._fulfill_next_pending_request(FakeReplica(name, {}), meta)
        return [pending.future.result().replica_id for pending in choices if pending.future.done()]

    assert asyncio.run(scenario()) == ["x", "y", "z"]


def test_oldest_open_with_id_skips_done_and_other_ids():
    from serving.llm.pending_calls import oldest_open_with_id

    def pending(internal_id: str, done: bool) -> SimpleNamespace:
        future = SimpleNamespace(done=lambda: done)
        return SimpleNamespace(
            future=future, metadata=SimpleNamespace(internal_request_id=internal_id)
        )

    queue = [pending("a", True), pending("b", False), pending("a", False), pending("a", False)]
    assert oldest_open_with_id(queue, "a") is queue[2]
    assert oldest_open_with_id(queue, "c") is None


def test_router_defers_a_replica_in_its_slow_start_window_unless_the_draw_keeps_it(monkeypatch):
    router = make_router()
    young = FakeReplica("young", {**stats(9000), "slow_start_fraction": 0.2})
    old = FakeReplica("old", stats(5000))
    request = SimpleNamespace(routing_context=SimpleNamespace(should_backoff=False))

    def ids(ranked) -> list[list[str]]:
        return [[r.replica_id for r in rank] for rank in ranked]

    monkeypatch.setattr("random.random", lambda: 0.5)
    assert ids(asyncio.run(router.choose_replicas([young, old], request))) == [["old"], ["young"]]
    monkeypatch.setattr("random.random", lambda: 0.1)
    assert ids(asyncio.run(router.choose_replicas([young, old], request))) == [["young"], ["old"]]


def test_slow_start_demotes_no_one_when_every_replica_is_in_its_window(monkeypatch):
    """Two replicas that just came up together: neither is warmer, so the ranks stand."""
    router = make_router()
    a = FakeReplica("a", {**stats(9000), "slow_start_fraction": 0.2})
    b = FakeReplica("b", {**stats(5000), "slow_start_fraction": 0.3})
    request = SimpleNamespace(routing_context=SimpleNamespace(should_backoff=False))
    monkeypatch.setattr("random.random", lambda: 0.99)
    ranked = asyncio.run(router.choose_replicas([a, b], request))
    assert [[r.replica_id for r in rank] for rank in ranked] == [["a"], ["b"]]


def test_the_prefix_replica_keeps_its_first_rank_in_its_slow_start_window(monkeypatch):
    """Its KV holds the prefix; the bound's max_imbalance caps its load, not slow start. The
    replicas after it are still reordered by slow start."""
    from serving.llm.prefix_affinity import prefix_key, rendezvous_order
    from serving.llm.router import PrefixAffinityRouter
    from serving.ray_internals import router_kwargs

    router = PrefixAffinityRouter(**router_kwargs("hot", "app"))
    router.initialize_state(prefix_tokens=4)
    prompt = (7, 8, 9, 10, 11)
    young = {**stats(9000), "slow_start_fraction": 0.2, "num_running": 0, "num_waiting": 0}
    old = {**stats(5000), "num_running": 0, "num_waiting": 0}
    ids = ["p", "q", "s"]
    home, second, third = rendezvous_order(prefix_key(prompt, 4), ids)
    replicas = [FakeReplica(home, young), FakeReplica(second, young), FakeReplica(third, old)]
    request = SimpleNamespace(
        args=[SimpleNamespace(prompt_token_ids=prompt)],
        routing_context=SimpleNamespace(should_backoff=False),
    )
    monkeypatch.setattr("random.random", lambda: 0.99)  # every young replica's draw fails
    ranked = asyncio.run(router.choose_replicas(replicas, request))
    assert [[r.replica_id for r in rank] for rank in ranked] == [[home], [third], [second]]
