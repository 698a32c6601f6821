"""Metrics of a dynamically batched replica (ray.serve.metrics; Ray adds the `ray_` prefix).

Every tuner decision that changes a knob increments `tideserve_batch_tuner_changes` tagged with its
action (double | step_back), and the gauges show the knobs in force, so a dashboard shows what the
tuner did and when; the reason text goes to the replica log.
"""

from __future__ import annotations

from typing import Any

from serving.embed.batch_loop import BatchRecord
from serving.embed.tuner import TunerDecision
from serving.telemetry import LATENCY_BUCKETS_S, MetricFactory, serve_metric

BATCH_TARGET_SIZE = "tideserve_batch_target_size"
BATCH_WINDOW = "tideserve_batch_window_seconds"
BATCH_SIZE = "tideserve_batch_size"
BATCH_RUN = "tideserve_batch_run_seconds"
BATCH_QUEUE = "tideserve_batch_queue_depth"
TUNER_CHANGES = "tideserve_batch_tuner_changes"
EMBED_LATENCY = "tideserve_embed_latency_seconds"
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# name -> (kind, tag keys, description)
BATCH_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    BATCH_TARGET_SIZE: ("gauge", (), "Batch target size in force (the tuner moves it)."),
    BATCH_WINDOW: ("gauge", (), "Batch window in force, seconds."),
    BATCH_SIZE: ("histogram", ("lane", "reason"), "Requests per sent batch."),
    BATCH_RUN: ("histogram", (), "Model time per batch."),
    BATCH_QUEUE: ("gauge", (), "Requests waiting to be batched."),
    TUNER_CHANGES: ("counter", ("action",), "Tuner decisions that changed size or window."),
    EMBED_LATENCY: ("histogram", ("lane",), "Arrival at the replica to the result."),
}


class BatchMetrics:
    def __init__(self, *, factory: MetricFactory = serve_metric) -> None:
        self._m: dict[str, Any] = {}
        for name, (kind, tags, description) in BATCH_METRICS.items():
            bounds = SIZE_BUCKETS if name == BATCH_SIZE else LATENCY_BUCKETS_S
            self._m[name] = factory(
                kind, name, description, tags, bounds if kind == "histogram" else None
            )

    def knobs(self, size: int, window_s: float) -> None:
        self._m[BATCH_TARGET_SIZE].set(float(size))
        self._m[BATCH_WINDOW].set(float(window_s))

    def batch(self, record: BatchRecord, num_waiting: int) -> None:
        self._m[BATCH_SIZE].observe(
            float(record.size), tags={"lane": record.lane, "reason": record.reason}
        )
        self._m[BATCH_RUN].observe(record.run_s)
        self._m[BATCH_QUEUE].set(float(num_waiting))

    def tuned(self, decision: TunerDecision) -> None:
        self.knobs(decision.size, decision.window_s)
        if decision.changed:
            self._m[TUNER_CHANGES].inc(1.0, tags={"action": decision.action})

    def latency(self, lane: str, seconds: float) -> None:
        self._m[EMBED_LATENCY].observe(seconds, tags={"lane": lane})
