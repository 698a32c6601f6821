"""Adapter-aware routing, pure: an adapter's requests go to one home replica (or to one that
already holds it in a slot), a hot adapter spills to the same second replica, and adapters
spread over the replicas so each cycles only its share through its slots."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serving.engine.sampling_params import SamplingParams
from serving.llm.adapter_affinity import IN_SLOTS_KEY, adapter_choice, adapter_key, holds
from serving.llm.messages import AdapterRef, GenerateRequest
from serving.llm.pending_calls import adapter_of
from serving.llm.prefix_affinity import AffinityBound, prefix_key, rendezvous_order
from serving.llm.router import prefix_affinity_ranks, routing_stats_from_engine
from tests.conftest import engine_stats
from tests.unit.llm.test_prefix_affinity import stats

BOUND = AffinityBound(prefix_tokens=8, max_waiting=2, max_kv_use_fraction=0.9)
IDS = ["r0", "r1", "r2", "r3"]


def fleet(**per_replica):
    """(replica, id, stats) triples; per_replica maps an id to its stats (default: idle)."""
    return [(i, i, per_replica.get(i, stats())) for i in IDS]


def home_of(name: str) -> str:
    return rendezvous_order(adapter_key(name), IDS)[0]


def test_every_request_of_an_adapter_goes_to_its_home_replica():
    choices = {adapter_choice("sql-tuned", fleet(), BOUND) for _ in range(10)}
    assert choices == {home_of("sql-tuned")}


def test_adapters_spread_evenly_over_the_replicas():
    counts = dict.fromkeys(IDS, 0)
    for n in range(400):
        counts[adapter_choice(f"ft-{n}", fleet(), BOUND)] += 1
    assert min(counts.values()) > 70  # ~100 each: a replica cycles a quarter of the adapters


def test_a_hot_adapter_spills_to_the_same_second_replica():
    order = rendezvous_order(adapter_key("hot-one"), IDS)
    busy_home = fleet(**{order[0]: stats(waiting=5)})
    assert {adapter_choice("hot-one", busy_home, BOUND) for _ in range(5)} == {order[1]}
    both_busy = fleet(**{order[0]: stats(waiting=5), order[1]: stats(free=50)})
    assert adapter_choice("hot-one", both_busy, BOUND) == order[2]


def test_a_replica_that_holds_the_adapter_goes_before_its_home():
    order = rendezvous_order(adapter_key("x"), IDS)
    holder = {**stats(), IN_SLOTS_KEY: ["y", "x"]}
    assert adapter_choice("x", fleet(**{order[2]: holder}), BOUND) == order[2]
    # ...unless the holder is past the bound: then the home replica loads it
    busy_holder = {**stats(waiting=9), IN_SLOTS_KEY: ["x"]}
    assert adapter_choice("x", fleet(**{order[2]: busy_holder}), BOUND) == order[0]


def test_every_replica_past_the_bound_means_no_affinity_and_ranks_by_headroom():
    full = {i: stats(waiting=5, free=50 + 20 * n) for n, i in enumerate(IDS)}
    assert adapter_choice("x", fleet(**full), BOUND) is None
    ranks = prefix_affinity_ranks([1, 2, 3], fleet(**full), BOUND, adapter="x")
    assert [r for rank in ranks for r in rank] == ["r3", "r2", "r1", "r0"]  # most headroom first
    assert adapter_choice("x", [], BOUND) is None


def test_ranks_put_the_adapter_replica_first_whatever_the_prompt():
    for prompt in ([1, 2, 3], [9, 9, 9, 9, 9, 9, 9, 9, 9]):
        ranks = prefix_affinity_ranks(prompt, fleet(), BOUND, adapter="x")
        assert ranks[0] == [home_of("x")]
        assert sorted(r for rank in ranks for r in rank) == IDS
    # the base model's requests keep keying on the prompt prefix
    base = prefix_affinity_ranks(list(range(8)), fleet(), BOUND)
    assert base[0] == [rendezvous_order(prefix_key(list(range(8)), 8), IDS)[0]]


def test_holds_reads_the_routing_stats_list():
    assert holds({IN_SLOTS_KEY: ["a"]}, "a") and not holds({IN_SLOTS_KEY: ["a"]}, "b")
    assert not holds(None, "a") and not holds({IN_SLOTS_KEY: "a"}, "a")


def test_replicas_report_the_adapters_in_their_slots_only_when_they_serve_adapters():
    with_slots = engine_stats(lora_slots_total=4, lora_in_slots=("a", "b"))
    assert routing_stats_from_engine(with_slots, 0)[IN_SLOTS_KEY] == ["a", "b"]
    assert IN_SLOTS_KEY not in routing_stats_from_engine(engine_stats(), 0)


def test_the_router_reads_the_adapter_of_a_generate_call_and_of_a_load_call():
    ref = AdapterRef("x", "/adapters/x", "load-1")
    request = GenerateRequest("r", (1, 2), SamplingParams(max_tokens=1), adapter=ref)
    assert adapter_of(SimpleNamespace(args=[request])) == "x"
    base = GenerateRequest("r", (1, 2), SamplingParams(max_tokens=1))
    assert adapter_of(SimpleNamespace(args=[base])) is None
    assert adapter_of(SimpleNamespace(args=[ref])) == "x"  # load_adapter(ref)
    assert adapter_of(SimpleNamespace(args=[])) is None and adapter_of(None) is None


def test_the_serve_router_sends_an_adapter_request_to_its_replica():
    from serving.llm.router import PrefixAffinityRouter
    from serving.ray_internals import router_kwargs

    router = PrefixAffinityRouter(**router_kwargs("hot", "app"))
    router.initialize_state(prefix_tokens=8)
    replicas = [SimpleNamespace(replica_id=i, routing_stats=stats()) for i in IDS]
    ref = AdapterRef("x", "/adapters/x")
    request = SimpleNamespace(
        args=[GenerateRequest("r", (5, 6, 7), SamplingParams(max_tokens=1), adapter=ref)],
        routing_context=SimpleNamespace(should_backoff=False),
    )
    ranked = asyncio.run(router.choose_replicas(replicas, request))
    assert [r.replica_id for r in ranked[0]] == [home_of("x")]
