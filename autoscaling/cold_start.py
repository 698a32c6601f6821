"""Cold-start measurement: from "target raised" to "replica running" (pure; time passed in).

The controller tells the tracker when it raised a pool's target (`requested`) and what replica count
Serve reports running at each poll (`observe_running`). Each rise of the running count completes
the oldest pending request, and the elapsed time is one sample. Samples feed the p95 that sets the
forecast lead (R5: scale up a cold start ahead of the forecast peak, never once requests wait).

Matching by count, not by replica id, is deliberate: Serve's public status gives counts per state,
and a replica that Serve restarts without a request from us (a crash) is not a cold start we asked
for, so a rise with nothing pending is ignored.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from common.stats import percentile

DEFAULT_MAX_SAMPLES = 64


class ColdStartTracker:
    """Pending scale-up requests of one pool and the cold-start samples they produced."""

    def __init__(
        self, samples_s: Iterable[float] = (), max_samples: int = DEFAULT_MAX_SAMPLES
    ) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples={max_samples!r} is out of range; allowed: >= 1")
        self.samples_s: deque[float] = deque(
            (float(s) for s in samples_s if math.isfinite(s) and s >= 0), maxlen=max_samples
        )
        self.pending_since_s: deque[float] = deque()  # oldest first
        self.last_running: int | None = None

    def requested(self, num_new: int, t_s: float) -> None:
        """The target rose by num_new replicas at t_s."""
        self.pending_since_s.extend([t_s] * max(0, num_new))

    def cancelled(self, num: int) -> None:
        """The target fell before num pending replicas came up: forget the newest requests."""
        for _ in range(min(num, len(self.pending_since_s))):
            self.pending_since_s.pop()

    def observe_running(self, num_running: int, t_s: float) -> list[float]:
        """Record Serve's running count at t_s; return the cold starts completed by this poll."""
        previous = num_running if self.last_running is None else self.last_running
        self.last_running = num_running
        done: list[float] = []
        for _ in range(max(0, num_running - previous)):
            if not self.pending_since_s:
                break  # a restart Serve did on its own: not a cold start we asked for
            done.append(max(0.0, t_s - self.pending_since_s.popleft()))
        self.samples_s.extend(done)
        return done

    @property
    def num_pending(self) -> int:
        return len(self.pending_since_s)

    def p95_s(self) -> float | None:
        """p95 of the recorded cold starts; None until one was measured."""
        return percentile(self.samples_s, 95.0, empty=None)
