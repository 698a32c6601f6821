"""Prefix-aware routing (decision 9): send a prompt to the replica that probably holds its KV.

A request's key is a hash of its prompt's first `prefix_tokens` tokens (a chat's system prompt
and the start of its first user message: every later turn of the conversation resends them, so
every turn gets the same key). The key picks a replica by rendezvous hashing (highest random
weight), a consistent hashing: adding or removing one of n replicas moves only the keys that
replica wins or held, about 1/n of them, so scale-up and scale-down keep most caches useful.
The preferred replica is skipped when it is past a load bound (queue or KV use), and the
request then goes by KV headroom as before (serving/llm/router.py), like Ray Serve LLM's
PrefixCacheAffinityRouter falls back to power-of-two when the cluster is imbalanced.

A prompt shorter than `prefix_tokens` keys on all of it: a conversation whose first prompt was
shorter than that may move once, on the turn its history first reaches `prefix_tokens`, then it
stays. Pure functions, no Ray, no torch: the router runs in the ingress and proxy processes.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K")

DEFAULT_PREFIX_TOKENS = 128


@dataclass(frozen=True, slots=True)
class AffinityBound:
    """When the preferred replica is too busy to wait for: more than `max_waiting` requests
    queued there, KV use (busy / total blocks) at `max_kv_use_fraction` or more, or more than
    `max_imbalance` requests (running + waiting) beyond the least-loaded replica (a prefix
    that every request shares, such as a long system prompt, would otherwise send all of
    them to one replica while another idles)."""

    prefix_tokens: int = DEFAULT_PREFIX_TOKENS
    max_waiting: int = 4
    max_kv_use_fraction: float = 0.9
    max_imbalance: int = 8

    def __post_init__(self) -> None:
        for name, value, lo in (
            ("prefix_tokens", self.prefix_tokens, 1),
            ("max_waiting", self.max_waiting, 0),
            ("max_imbalance", self.max_imbalance, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"AffinityBound.{name}={value!r} must be an integer >= {lo}")
        frac = self.max_kv_use_fraction
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0.0 < frac <= 1.0:
            raise ValueError(f"AffinityBound.max_kv_use_fraction={frac!r} must be in (0, 1]")


def prefix_key(prompt_token_ids: Sequence[int], prefix_tokens: int) -> bytes | None:
    """The routing key of a prompt; None for an empty prompt (nothing to be affine to)."""
    head = prompt_token_ids[:prefix_tokens]
    if not head:
        return None
    return hashlib.blake2b(array("q", head).tobytes(), digest_size=16).digest()


def _weight(key: bytes, replica_id: Hashable) -> bytes:
    return hashlib.blake2b(key + str(replica_id).encode(), digest_size=8).digest()


def preferred(key: bytes, replica_ids: Sequence[K]) -> K:
    """The replica a key belongs to: the highest rendezvous weight (ties cannot matter: the
    weights are 64-bit hashes of distinct ids)."""
    if not replica_ids:
        raise ValueError("no replicas to prefer")
    return max(replica_ids, key=lambda rid: _weight(key, rid))


def rendezvous_order(key: bytes, replica_ids: Sequence[K]) -> list[K]:
    """The replicas in the key's order of preference (preferred() first): a key that spills
    past its first replica goes to the same second one every time."""
    return sorted(replica_ids, key=lambda rid: _weight(key, rid), reverse=True)


def over_bound(routing_stats: Mapping[str, Any] | None, bound: AffinityBound) -> bool:
    """Whether a replica's last routing stats put it past the bound (no stats: a new, empty
    replica, not past it)."""
    if not routing_stats:
        return False
    try:
        waiting = float(routing_stats["num_waiting"])
        total = float(routing_stats["kv_total_tokens"])
        free = float(routing_stats["kv_free_tokens"])
    except (KeyError, TypeError, ValueError):
        return True  # unusable stats: do not pile requests onto a replica we cannot read
    use = 1.0 - free / total if total > 0 else 1.0
    return waiting > bound.max_waiting or use >= bound.max_kv_use_fraction


def affinity_choice(
    key: bytes | None,
    replicas: Sequence[tuple[K, Hashable, Mapping[str, Any] | None]],
    bound: AffinityBound,
) -> K | None:
    """The replica (of (replica, id, routing stats) triples) a request should go to for its
    prefix, or None: no key, no replicas, or the preferred one is past the bound."""
    if key is None or not replicas:
        return None
    by_id = {rid: (replica, stats) for replica, rid, stats in replicas}
    replica, stats = by_id[preferred(key, list(by_id))]
    least = min(load_of(s) for _, _, s in replicas)
    return replica if within_bound(stats, least, bound) else None


def within_bound(routing_stats: Mapping[str, Any] | None, least: float, bound: AffinityBound):
    """Not past the bound, and holding at most max_imbalance requests more than the least
    loaded replica (`least`)."""
    if over_bound(routing_stats, bound):
        return False
    return load_of(routing_stats) - least <= bound.max_imbalance


def load_of(routing_stats: Mapping[str, Any] | None) -> float:
    """Requests a replica holds (running + waiting); 0 without stats (a new replica)."""
    if not routing_stats:
        return 0.0
    try:
        return float(routing_stats["num_running"]) + float(routing_stats["num_waiting"])
    except (KeyError, TypeError, ValueError):
        return 0.0
