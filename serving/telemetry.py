"""The metric layer both apps share: one factory over ray.serve.metrics and the latency buckets.

Ray exports every name with the prefix `ray_`. Code that records metrics takes a `MetricFactory`
so tests can pass a recording fake instead of Ray's objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# 10 ms .. 120 s, roughly 1-2.5-5 per decade: TTFT lives at the low end, offline e2e at the top.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip

# (kind, name, description, tag_keys, boundaries or None) -> an object with set/observe/inc
MetricFactory = Callable[[str, str, str, tuple[str, ...], "tuple[float, ...] | None"], Any]


def serve_metric(
    kind: str,
    name: str,
    description: str,
    tag_keys: tuple[str, ...],
    boundaries: tuple[float, ...] | None,
) -> Any:
    from ray.serve.metrics import Counter, Gauge, Histogram

    if kind == "histogram":
        return Histogram(name, description, boundaries=list(boundaries or ()), tag_keys=tag_keys)
    if kind == "gauge":
        return Gauge(name, description, tag_keys=tag_keys)
    if kind == "counter":
        return Counter(name, description, tag_keys=tag_keys)
    raise ValueError(f"metric kind={kind!r}; allowed: ['counter', 'gauge', 'histogram']")
