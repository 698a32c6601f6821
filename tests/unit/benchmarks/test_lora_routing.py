"""The pure part of the LoRA routing benchmark: a Zipf stream of adapter requests, routed by the
production adapter ranking or blindly, over replicas whose slots are the engine's LRU SlotPool."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks._lora_routing import (
    adapter_names,
    loads_ratio,
    simulate,
    slot_sweep,
    zipf_stream,
    zipf_weights,
)
from serving.llm.adapter_affinity import adapter_key
from serving.llm.prefix_affinity import preferred

IDS = ["replica-a", "replica-b"]


def test_zipf_weights_fall_as_one_over_rank_and_sum_to_one():
    w = zipf_weights(50)
    assert sum(w) == pytest.approx(1.0)
    assert w[0] / w[1] == pytest.approx(2.0) and w[0] / w[9] == pytest.approx(10.0)
    assert w[0] == pytest.approx(1 / sum(1 / k for k in range(1, 51)))  # 0.222: the top one
    with pytest.raises(ValueError, match="num=0"):
        zipf_weights(0)


def test_the_stream_repeats_for_a_seed_and_the_most_popular_adapter_leads():
    names = adapter_names(50)
    stream = zipf_stream(names, 5000, seed=3)
    assert stream == zipf_stream(names, 5000, seed=3)
    assert stream != zipf_stream(names, 5000, seed=4)
    counts = Counter(stream)
    assert counts.most_common(1)[0][0] == "ft00"
    assert 0.19 < counts["ft00"] / 5000 < 0.25  # 1 / H(50) = 0.222
    assert set(stream) <= set(names)


def test_affinity_serves_each_adapter_on_its_home_replica_only():
    names = adapter_names(20)
    stream = zipf_stream(names, 2000, seed=1)
    # slots enough for every adapter: after the first request of each, no more loads
    run = simulate(stream, 2, 20, "affinity", replica_ids=IDS)
    assert run.total_loads == len(set(stream))  # one load per adapter, on one replica only
    homes = Counter(preferred(adapter_key(name), IDS) for name in stream)
    assert run.requests == (homes["replica-a"], homes["replica-b"])


def test_blind_routing_loads_popular_adapters_on_every_replica():
    stream = zipf_stream(adapter_names(20), 2000, seed=1)
    blind = simulate(stream, 2, 20, "blind", seed=5, replica_ids=IDS)
    affinity = simulate(stream, 2, 20, "affinity", replica_ids=IDS)
    assert blind.total_loads > affinity.total_loads
    assert blind.total_loads <= 2 * len(set(stream))  # with room for all: once per replica
    assert sum(blind.requests) == 2000 and min(blind.requests) > 900  # uniformly random


def test_loads_count_from_the_warmup_on():
    stream = zipf_stream(adapter_names(20), 2000, seed=1)
    warm = simulate(stream, 2, 20, "affinity", warmup=1000, replica_ids=IDS)
    assert sum(warm.requests) == 1000
    assert warm.total_loads == len(set(stream)) - len(set(stream[:1000]))
    everything = simulate(stream, 2, 20, "affinity", warmup=2000, replica_ids=IDS)
    assert everything.requests == (0, 0) and everything.total_loads == 0


def test_scarce_slots_evict_and_affinity_still_loads_fewer():
    stream = zipf_stream(adapter_names(50), 4000, seed=2)
    affinity = simulate(stream, 2, 8, "affinity", warmup=400, replica_ids=IDS)
    blind = simulate(stream, 2, 8, "blind", warmup=400, replica_ids=IDS)
    assert sum(affinity.evictions) > 0 and sum(blind.evictions) > 0
    assert affinity.total_loads < blind.total_loads
    assert loads_ratio(blind, affinity) == blind.total_loads / affinity.total_loads


def test_no_affinity_loads_is_no_ratio():
    run = simulate(["ft00"] * 10, 2, 4, "affinity", warmup=1, replica_ids=IDS)
    assert run.total_loads == 0 and loads_ratio(run, run) is None


def test_the_sweep_reports_each_slot_limit_and_the_lowest_ratio_of_its_id_sets():
    stream = zipf_stream(adapter_names(50), 3000, seed=0)
    sweep = slot_sweep(stream, 2, (4, 25), warmup=300, seed=0)
    assert [row["slots"] for row in sweep["by_slots"]] == [4, 25]
    scarce, roomy = sweep["by_slots"]
    for row in (scarce, roomy):
        ratios = [r["loads_ratio"] for r in row["by_replica_ids"]]
        assert len(ratios) == 3 and row["loads_ratio_min"] == min(ratios)
        assert all(sum(r["affinity_requests"]) == 2700 for r in row["by_replica_ids"])
    # more slots, fewer loads per request for both; affinity's drop is the larger one
    assert roomy["affinity_loads_per_request"] < scarce["affinity_loads_per_request"]
    assert roomy["blind_loads_per_request"] < scarce["blind_loads_per_request"]
    assert roomy["loads_ratio_min"] > scarce["loads_ratio_min"] > 1.0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"policy": "random"}, "policy='random'"),
        ({"warmup": 11}, "warmup=11"),
        ({"replica_ids": ["x", "x"]}, "distinct"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, says):
    args = {"stream": ["ft00"] * 10, "num_replicas": 2, "num_slots": 4, "policy": "affinity"}
    with pytest.raises(ValueError, match=says):
        simulate(**{**args, **kwargs})
