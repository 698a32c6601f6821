"""DynamicBatchingSection: the `dynamic_batching:` section of an embedding app (model.task: embed).

How the embedding replicas group single requests into one forward pass (the closing rule is
serving/embed/batching.py). Named `dynamic_batching`, not `batching`, so that it cannot be
mistaken for `batch_api:` (OpenAI's Batch API, serving/config/batch_api.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

from common.validate import check_bool, check_range

MAX_BATCH_SIZE_LIMIT = 256  # R2: never "wait for 128"-style giant batches by accident
MAX_WINDOW_S = 1.0


@dataclass(frozen=True, slots=True)
class DynamicBatchingSection:
    """The `dynamic_batching:` section of an embedding app (model.task: embed)."""

    _owner: ClassVar[str] = "dynamic_batching"

    max_batch_size: int = 16  # the target size (R2 starting point)
    window_s: float = 0.02  # the longest the oldest request of a group waits for company
    # Length buckets: inclusive upper bounds, ascending; only same-bucket requests batch (R10).
    bucket_edges_tokens: tuple[int, ...] = (32, 64, 128, 256)
    stagger_slices: int = 2  # 1 = the plain R2 rule
    max_queue: int = 256  # waiting requests per replica; beyond it: 429 with Retry-After
    # R10: refuse (429) while the estimated queue wait (waiting x recent model seconds per
    # request) is above this; None: only max_queue bounds the queue.
    max_queue_wait_s: float | None = None
    tuner: bool = False  # R7 online tuner: starts at 8 / 50 ms and moves size and window
    p99_target_s: float = 0.2  # the tuner's p99 latency target (R1: <= 200 ms is a pass)
    tuner_interval_s: float = 5.0  # seconds of traffic behind each tuner decision

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "max_batch_size", self.max_batch_size, 1, MAX_BATCH_SIZE_LIMIT, integer=True)
        check_range(o, "window_s", self.window_s, 0.0, MAX_WINDOW_S)
        edges = self.bucket_edges_tokens
        if not isinstance(edges, list | tuple) or not edges:
            raise ValueError(f"{o}.bucket_edges_tokens={edges!r} must be a non-empty list")
        for i, edge in enumerate(edges):
            check_range(o, f"bucket_edges_tokens[{i}]", edge, 1, None, integer=True)
        if any(a >= b for a, b in itertools.pairwise(edges)):
            raise ValueError(f"{o}.bucket_edges_tokens={list(edges)!r} must strictly ascend")
        object.__setattr__(self, "bucket_edges_tokens", tuple(edges))
        check_range(o, "stagger_slices", self.stagger_slices, 1, 8, integer=True)
        check_range(o, "max_queue", self.max_queue, 1, None, integer=True)
        if self.max_queue_wait_s is not None:
            check_range(o, "max_queue_wait_s", self.max_queue_wait_s, 0.0, 3600.0, lo_open=True)
        check_bool(o, "tuner", self.tuner)
        check_range(o, "p99_target_s", self.p99_target_s, 0.0, 600.0, lo_open=True)
        check_range(o, "tuner_interval_s", self.tuner_interval_s, 0.0, 3600.0, lo_open=True)
