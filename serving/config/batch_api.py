"""BatchApiSection: the `batch_api:` section of cluster.yaml, the Batch API (/v1/files and
/v1/batches) run by the offline lane of serving/batch/.

Named `batch_api`, not `batch`, so that it cannot be mistaken for `dynamic_batching:` (the
embedding replicas' request batcher, serving/config/dynamic_batching.py) or for the engine's
continuous batching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from common.validate import check_range

DAY_S = 86400.0


def _seconds(owner: str, name: str, value: Any, lo: float, hi: float | None = None) -> None:
    check_range(owner, name, value, lo, hi)
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name}={value!r} must be a finite number of seconds")


@dataclass(frozen=True, slots=True)
class BatchApiSection:
    """The offline lane of a generate app: /v1/files and /v1/batches (docs/batch.md)."""

    _owner: ClassVar[str] = "batch_api"

    # Directory of uploaded files, batch records and their result journals (format: docs/batch.md).
    # Put it on a disk that survives a restart of the app; null: ~/.cache/tideserve/batch/<app>.
    store_path: str | None = None
    max_file_bytes: int = 104857600  # an upload larger than this: 413
    max_requests_per_batch: int = 50000  # lines in one input file
    # The longest completion_window a batch may ask for ("24h" is OpenAI's only value).
    max_completion_window_s: float = DAY_S
    # Batch requests in flight at once, whatever the idle capacity (a ceiling, not a target).
    max_in_flight: int = 16
    # Share of a replica's free request slots the lane may fill (the engine also caps offline
    # work at engine.offline_idle_fraction of its concurrency window).
    slot_share: float = 0.5
    poll_interval_s: float = 0.5  # how often the lane reads the replicas and decides
    # After a replica refuses offline work (KV not idle, queue full), wait this long before
    # sending more: the refusal says live traffic holds the capacity.
    refusal_backoff_s: float = 2.0
    # Cold replicas the lane may ask for, off-peak only, when the forecast valleys cannot finish
    # the open batches by their deadlines (docs/batch.md); the cold pool's own bounds still
    # apply. 0: the lane never asks.
    max_cold_replicas: int = 2

    def __post_init__(self) -> None:
        o = self._owner
        if self.store_path is not None and not (
            isinstance(self.store_path, str) and self.store_path.strip()
        ):
            raise ValueError(f"{o}.store_path={self.store_path!r} must be null or a directory")
        check_range(o, "max_file_bytes", self.max_file_bytes, 1, None, integer=True)
        check_range(o, "max_requests_per_batch", self.max_requests_per_batch, 1, None, integer=True)
        _seconds(o, "max_completion_window_s", self.max_completion_window_s, 1.0, 7 * DAY_S)
        check_range(o, "max_in_flight", self.max_in_flight, 1, 4096, integer=True)
        check_range(o, "slot_share", self.slot_share, 0.0, 1.0, lo_open=True)
        _seconds(o, "poll_interval_s", self.poll_interval_s, 0.01, 60.0)
        _seconds(o, "refusal_backoff_s", self.refusal_backoff_s, 0.0, 600.0)
        check_range(o, "max_cold_replicas", self.max_cold_replicas, 0, 1024, integer=True)
