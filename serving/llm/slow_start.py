"""Slow start: a replica that just became ready takes a growing share of the traffic.

A new replica is empty, so ranking by KV headroom alone would send it every request of the next
routing period at once, while its caches (page cache, allocator, compiled kernels; CUDA graphs
on a GPU) are still cold. Like Envoy's slow-start mode, the replica reports how far into its
window it is (`slow_start_fraction` in its routing stats, 1.0 once past it) and the router keeps
it in its rank only with that probability; otherwise it is tried after every other rank. When
every other replica is full the request still reaches it: slow start never makes a request wait.

Two cases keep the ranks as they are. When every candidate is in its window (replicas that came
up together) none is warmer to prefer. And the PrefixAffinityRouter's affine replica keeps its
first rank: the request's prefix KV (or its LoRA adapter) is there, and the affinity bound's
max_imbalance already caps how far ahead of the least loaded replica it gets. Deferring it
would scatter a conversation's turns over replicas that hold none of its cache.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

K = TypeVar("K")

SLOW_START_KEY = "slow_start_fraction"
# A replica's first request should not wait for the window: it starts with this share.
MIN_FRACTION = 0.1


def slow_start_fraction(age_s: float, window_s: float) -> float:
    """The share of its rank's traffic a replica ready for `age_s` seconds takes: rising
    linearly from MIN_FRACTION at 0 to 1.0 at `window_s` (0 disables slow start)."""
    if window_s <= 0 or age_s >= window_s:
        return 1.0
    return MIN_FRACTION + (1.0 - MIN_FRACTION) * max(0.0, age_s) / window_s


def fraction_of(routing_stats: Mapping[str, Any] | None) -> float:
    """The reported fraction, 1.0 when absent or unusable (an older replica's stats)."""
    value = (routing_stats or {}).get(SLOW_START_KEY, 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        return 1.0
    return float(value)


def apply_slow_start(
    ranks: list[list[K]],
    fraction: Callable[[K], float],
    draw: Callable[[], float] | None = None,
) -> list[list[K]]:
    """Ranks with each replica still in its slow-start window (`fraction(replica)` < 1) kept in
    place with that probability (a draw below it, random.random by default), else moved to one
    rank after all others."""
    draw = draw or random.random
    kept: list[list[K]] = []
    deferred: list[K] = []
    for rank in ranks:
        stay = []
        for key in rank:
            share = fraction(key)
            (stay if share >= 1.0 or draw() < share else deferred).append(key)
        if stay:
            kept.append(stay)
    return [*kept, deferred] if deferred else kept
