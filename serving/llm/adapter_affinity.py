"""Adapter-aware routing: an adapter's requests go to the replicas that hold it.

A LoRA request's replica is chosen by its adapter, not its prompt: the adapter's name picks the
replicas by rendezvous hashing (serving/llm/prefix_affinity.py), so each adapter has one home
replica and the adapters spread evenly over the replicas; a replica then cycles only its share
of the adapters through its LoRA slots instead of all of them (fewer loads and evictions). The
prompt prefix adds nothing here: an adapter's cached KV blocks are salted with the adapter
(serving/engine/ledger.py), so its prefixes can only be reused where its requests go, which
the adapter key already makes one place.

A hot adapter spreads: when its home replica is past the load bound (AffinityBound: queue, KV
use, imbalance) the request goes to the next replica of the adapter's rendezvous order that is
within it, the same second replica every time, so the hot adapter occupies a slot on as few
replicas as its load needs. Among the replicas within the bound, one that already holds the
adapter in a slot (routing stats `lora_in_slots`, up to one stats period old) goes first: a
request sent there loads nothing. Pure functions, no Ray, no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeVar

from serving.llm.prefix_affinity import AffinityBound, load_of, rendezvous_order, within_bound

K = TypeVar("K")

IN_SLOTS_KEY = "lora_in_slots"  # routing stats: adapters holding a LoRA slot on the replica


def adapter_key(name: str) -> bytes:
    """The routing key of an adapter (a namespace apart from the prompt-prefix keys)."""
    return hashlib.blake2b(b"lora\0" + name.encode(), digest_size=16).digest()


def holds(routing_stats: Mapping[str, Any] | None, name: str) -> bool:
    held = (routing_stats or {}).get(IN_SLOTS_KEY) or ()
    return isinstance(held, list | tuple) and name in held


def adapter_choice(
    name: str,
    replicas: Sequence[tuple[K, Hashable, Mapping[str, Any] | None]],
    bound: AffinityBound,
) -> K | None:
    """The replica (of (replica, id, routing stats) triples) for a request of adapter `name`:
    among those within the bound, the first in the adapter's rendezvous order that holds it in
    a slot, else the first in that order; None when every replica is past the bound."""
    if not replicas:
        return None
    by_id = {rid: (replica, stats) for replica, rid, stats in replicas}
    least = min(load_of(stats) for _, _, stats in replicas)
    order = rendezvous_order(adapter_key(name), list(by_id))
    fit = [rid for rid in order if within_bound(by_id[rid][1], least, bound)]
    if not fit:
        return None
    holder = next((rid for rid in fit if holds(by_id[rid][1], name)), fit[0])
    return by_id[holder][0]
