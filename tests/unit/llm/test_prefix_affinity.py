"""Prefix-aware routing, pure: a prompt's prefix picks a replica by consistent hashing, few keys
move when replicas come and go, and a replica past the load bound is passed over."""

from __future__ import annotations

import random

import pytest

from serving.llm.prefix_affinity import (
    AffinityBound,
    affinity_choice,
    over_bound,
    preferred,
    prefix_key,
)
from serving.llm.router import prefix_affinity_ranks

BOUND = AffinityBound(prefix_tokens=8, max_waiting=2, max_kv_use_fraction=0.9)


def stats(waiting=0, free=900, total=1000, running=1):
    return {
        "kv_free_tokens": free,
        "kv_reserved_tokens": total - free,
        "kv_total_tokens": total,
        "queued_tokens": 0,
        "num_waiting": waiting,
        "num_running": running,
    }


def keys(n, seed=0):
    rng = random.Random(seed)
    return [prefix_key([rng.randrange(1000) for _ in range(8)], 8) for _ in range(n)]


def test_every_turn_of_a_conversation_has_the_key_of_its_first_tokens():
    turn1 = list(range(20))
    turn2 = [*turn1, 55, 66, 77]
    assert prefix_key(turn1, 16) == prefix_key(turn2, 16)
    assert prefix_key([1, *turn1[1:]], 16) != prefix_key(turn1, 16)
    assert prefix_key([], 16) is None


def test_keys_spread_over_the_replicas():
    ids = ["r0", "r1", "r2", "r3"]
    counts = {r: 0 for r in ids}
    for key in keys(4000):
        counts[preferred(key, ids)] += 1
    assert min(counts.values()) > 800  # ~1000 each


def test_adding_or_removing_a_replica_moves_only_the_keys_it_takes_or_held():
    ids = [f"r{i}" for i in range(4)]
    ks = keys(4000, seed=1)
    before = [preferred(k, ids) for k in ks]
    grown = [preferred(k, [*ids, "r4"]) for k in ks]
    moved = [(a, b) for a, b in zip(before, grown, strict=True) if a != b]
    assert all(b == "r4" for _, b in moved) and 0.12 < len(moved) / len(ks) < 0.28
    shrunk = [preferred(k, ids[1:]) for k in ks]
    moved = [(a, b) for a, b in zip(before, shrunk, strict=True) if a != b]
    assert all(a == "r0" for a, _ in moved) and 0.18 < len(moved) / len(ks) < 0.32


def test_a_replica_past_the_bound_is_passed_over():
    assert not over_bound(stats(waiting=2), BOUND)
    assert over_bound(stats(waiting=3), BOUND)
    assert over_bound(stats(free=100), BOUND)  # 90% of the KV in use
    assert not over_bound(None, BOUND)  # a new replica reports nothing yet: it is empty
    assert over_bound({"num_waiting": "x"}, BOUND)  # unreadable: not trusted with a pile


def test_the_prefix_replica_goes_first_then_the_rest_by_headroom():
    key_prompt = list(range(8))
    key = prefix_key(key_prompt, 8)
    ids = ["a", "b", "c"]
    home = preferred(key, ids)
    replicas = [(i, i, stats(free=500 + 100 * n)) for n, i in enumerate(ids)]
    ranks = prefix_affinity_ranks(key_prompt, replicas, BOUND)
    others = [i for i in sorted(ids, key=lambda i: -ids.index(i)) if i != home]
    assert ranks[0] == [home] and [r for rank in ranks[1:] for r in rank] == others
    busy = [(i, i, stats(waiting=5, free=400) if i == home else s) for i, _, s in replicas]
    ranks = prefix_affinity_ranks(key_prompt, busy, BOUND)
    assert ranks[-1] == [home] and home not in ranks[0]  # by headroom, as without affinity
    assert prefix_affinity_ranks(None, replicas, BOUND)[0] == ["c"]


def test_no_key_or_no_replicas_means_no_affinity():
    assert affinity_choice(None, [("a", "a", None)], BOUND) is None
    assert affinity_choice(b"k", [], BOUND) is None


def test_bound_settings_are_validated_by_name():
    with pytest.raises(ValueError, match="prefix_tokens"):
        AffinityBound(prefix_tokens=0)
    with pytest.raises(ValueError, match="max_kv_use_fraction"):
        AffinityBound(max_kv_use_fraction=1.5)


def test_a_prefix_every_request_shares_cannot_pile_them_onto_one_replica():
    prompt = list(range(8))
    home = preferred(prefix_key(prompt, 8), ["a", "b"])
    other = "b" if home == "a" else "a"
    balanced = [(home, home, stats(running=9)), (other, other, stats(running=1))]
    assert affinity_choice(prefix_key(prompt, 8), balanced, BOUND) == home  # 8 more: allowed
    piled = [(home, home, stats(running=10)), (other, other, stats(running=1))]
    assert affinity_choice(prefix_key(prompt, 8), piled, BOUND) is None  # 9 more: spills
