"""One admitted request's latency record at the replica: every request counts, however it ends.

TTFT (and the queue wait) is recorded when the first token leaves, not when the stream ends, and
end-to-end once, at whichever end comes first (metrics.END_REASONS). Recording both only at a
normal finish left out the requests the ingress cut at a stop string and those whose client left:
the slow ones are the likeliest to be abandoned, so the histograms read better than the service.
Time is passed in, so this is tested without a clock.
"""

from __future__ import annotations

from typing import Protocol


class LatencySink(Protocol):
    def observe_first_token(self, tier: str, ttft_s: float, queue_wait_s: float | None) -> None: ...

    def observe_end(self, tier: str, e2e_s: float, ttft_s: float | None, reason: str) -> None: ...


class RequestLatency:
    def __init__(self, sink: LatencySink, tier: str, arrived_s: float) -> None:
        self.sink = sink
        self.tier = tier
        self.arrived_s = arrived_s
        self.ttft_s: float | None = None
        self.end_reason: str | None = None

    def first_token(self, now_s: float, queue_wait_s: float | None) -> None:
        """Called for every delta; only the first one is the first token."""
        if self.ttft_s is not None:
            return
        self.ttft_s = now_s - self.arrived_s
        self.sink.observe_first_token(self.tier, self.ttft_s, queue_wait_s)

    def end(self, now_s: float, reason: str) -> None:
        """The request ended; the first end counts (a finish, then the stream's close, is one)."""
        if self.end_reason is not None:
            return
        self.end_reason = reason
        self.sink.observe_end(self.tier, now_s - self.arrived_s, self.ttft_s, reason)
