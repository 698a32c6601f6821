"""The pure part of benchmarks/lora_routing.py: a Zipf stream of adapter requests routed over
replicas whose LoRA slots are the engine's own SlotPool (serving/engine/lora/slots.py: LRU,
check-then-commit), counting slot loads.

Two policies pick each request's replica:
  affinity  the production ranking, `prefix_affinity_ranks(..., adapter=name)` (what
            PrefixAffinityRouter.choose_replicas returns), over routing stats that carry each
            replica's `lora_in_slots` as the replicas report them; the request goes to the
            first rank's first replica.
  blind     popularity-blind: a uniformly random replica (seeded). With equal KV headroom,
            KVHeadroomRouter puts every replica in one rank and Serve picks among them by
            queue length, which the request's adapter does not enter.

No time and no load: every replica reports the same KV stats with nothing running or waiting,
so the affinity bound never trips (a lightly loaded cluster) and no slot is pinned (a request
is done before the next). Deterministic for a seed; no Ray, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from capacity.adapters import zipf_popularity
from serving.engine.lora.slots import AllPinned, SlotPool
from serving.llm.adapter_affinity import IN_SLOTS_KEY
from serving.llm.prefix_affinity import AffinityBound
from serving.llm.router import prefix_affinity_ranks

POLICIES = ("affinity", "blind")

# What an idle replica reports (serving/llm/router.py routing_stats_from_engine).
_IDLE_STATS = {
    "kv_free_tokens": 4096,
    "kv_reserved_tokens": 0,
    "kv_total_tokens": 4096,
    "queued_tokens": 0,
    "num_waiting": 0,
    "num_running": 0,
}


def zipf_weights(num: int, exponent: float = 1.0) -> list[float]:
    """Popularity of ranks 1..num, weight 1 / k**exponent, normalised to sum 1."""
    if num < 1:
        raise ValueError(f"num={num!r} must be >= 1")
    raw = zipf_popularity(num, exponent)
    total = sum(raw)
    return [w / total for w in raw]


def adapter_names(num: int) -> list[str]:
    """Adapter names by popularity rank: ft00 is the most popular."""
    return [f"ft{k:02d}" for k in range(num)]


def zipf_stream(names: Sequence[str], num_requests: int, seed: int, exponent: float = 1.0):
    """`num_requests` adapter names drawn independently with Zipf popularity by list order."""
    rng = random.Random(seed)
    return rng.choices(list(names), weights=zipf_weights(len(names), exponent), k=num_requests)


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    num_slots: int
    requests: tuple[int, ...]  # per replica, counted requests
    loads: tuple[int, ...]  # per replica, slot loads during the counted requests
    evictions: tuple[int, ...]

    @property
    def total_loads(self) -> int:
        return sum(self.loads)


def simulate(
    stream: Sequence[str],
    num_replicas: int,
    num_slots: int,
    policy: str,
    seed: int = 0,
    warmup: int = 0,
    replica_ids: Sequence[str] | None = None,
) -> SimResult:
    """Route `stream` by `policy` over replicas of `num_slots` LRU slots each; loads and
    evictions count from request `warmup` on (the first ones fill empty slots)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} must be one of {POLICIES}")
    if not 0 <= warmup <= len(stream):
        raise ValueError(f"warmup={warmup!r} must be in [0, {len(stream)}]")
    ids = list(replica_ids or [f"replica-{r}" for r in range(num_replicas)])
    if len(ids) != num_replicas or len(set(ids)) != num_replicas:
        raise ValueError(f"replica_ids={ids!r} must be {num_replicas} distinct ids")
    pools = [SlotPool(num_slots) for _ in ids]
    rng = random.Random(seed)
    bound = AffinityBound()
    requests = [0] * num_replicas
    base_loads = base_evictions = [0] * num_replicas
    for i, name in enumerate(stream):
        if i == warmup:
            base_loads = [p.num_loads for p in pools]
            base_evictions = [p.num_evictions for p in pools]
        if policy == "blind":
            r = rng.randrange(num_replicas)
        else:
            triples = [
                (r, ids[r], {**_IDLE_STATS, IN_SLOTS_KEY: list(pools[r].slot_of)})
                for r in range(num_replicas)
            ]
            r = prefix_affinity_ranks(None, triples, bound, adapter=name)[0][0]
        plan = pools[r].plan(name)
        assert not isinstance(plan, AllPinned), "nothing is pinned in the simulation"
        pools[r].commit(name, plan)
        if i >= warmup:
            requests[r] += 1
    if warmup == len(stream):
        base_loads = [p.num_loads for p in pools]
        base_evictions = [p.num_evictions for p in pools]
    return SimResult(
        policy,
        num_slots,
        tuple(requests),
        tuple(p.num_loads - b for p, b in zip(pools, base_loads, strict=True)),
        tuple(p.num_evictions - b for p, b in zip(pools, base_evictions, strict=True)),
    )


def loads_ratio(blind: SimResult, affinity: SimResult) -> float | None:
    """How many times fewer loads affinity makes than blind routing (None: affinity loaded 0)."""
    return blind.total_loads / affinity.total_loads if affinity.total_loads else None


def slot_sweep(
    stream: Sequence[str], num_replicas: int, slot_limits: Sequence[int], warmup: int, seed: int
) -> dict:
    """Loads of both policies per slot limit, for three sets of replica ids (the ids decide
    which replica is each adapter's home, so they decide how evenly the popular ones split)."""
    counted = len(stream) - warmup
    rows = []
    for slots in slot_limits:
        per_ids = []
        for id_set in range(3):
            ids = [f"replica-{id_set}-{r}" for r in range(num_replicas)]
            runs = {
                p: simulate(stream, num_replicas, slots, p, seed, warmup, ids) for p in POLICIES
            }
            per_ids.append({
                "replica_ids": ids,
                "affinity_loads": list(runs["affinity"].loads),
                "blind_loads": list(runs["blind"].loads),
                "affinity_requests": list(runs["affinity"].requests),
                "loads_ratio": loads_ratio(runs["blind"], runs["affinity"]),
            })  # fmt: skip
        ratios = [r["loads_ratio"] for r in per_ids if r["loads_ratio"] is not None]
        rows.append({
            "slots": slots,
            "loads_ratio_min": min(ratios) if ratios else None,
            "affinity_loads_per_request": _mean(
                sum(r["affinity_loads"]) / counted for r in per_ids
            ),
            "blind_loads_per_request": _mean(sum(r["blind_loads"]) / counted for r in per_ids),
            "by_replica_ids": per_ids,
        })  # fmt: skip
    return {
        "num_requests": len(stream),
        "warmup_requests": warmup,
        "seed": seed,
        "blind_model": "uniformly random replica (equal KV headroom: one rank, adapter unseen)",
        "by_slots": rows,
    }


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
