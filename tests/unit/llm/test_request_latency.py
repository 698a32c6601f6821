"""RequestLatency: TTFT once at the first token, end-to-end once at the first end."""

from __future__ import annotations

from serving.llm.request_latency import RequestLatency


class Sink:
    def __init__(self) -> None:
        self.firsts: list[tuple] = []
        self.ends: list[tuple] = []

    def observe_first_token(self, tier, ttft_s, queue_wait_s):
        self.firsts.append((tier, ttft_s, queue_wait_s))

    def observe_end(self, tier, e2e_s, ttft_s, reason):
        self.ends.append((tier, e2e_s, ttft_s, reason))


def test_ttft_at_the_first_token_and_e2e_at_the_end():
    sink = Sink()
    clock = RequestLatency(sink, "interactive", arrived_s=100.0)
    clock.first_token(100.25, queue_wait_s=0.05)
    assert sink.firsts == [("interactive", 0.25, 0.05)] and sink.ends == []
    clock.first_token(100.5, queue_wait_s=0.05)  # later deltas are not first tokens
    clock.end(102.0, "stop")
    assert sink.firsts == [("interactive", 0.25, 0.05)]
    assert sink.ends == [("interactive", 2.0, 0.25, "stop")]


def test_the_first_end_counts_once():
    sink = Sink()
    clock = RequestLatency(sink, "offline", arrived_s=0.0)
    clock.first_token(1.0, None)
    clock.end(3.0, "length")
    clock.end(3.5, "cancelled")  # the stream's close after its finish is the same request
    assert sink.ends == [("offline", 3.0, 1.0, "length")]


def test_an_end_without_a_first_token_has_no_ttft():
    sink = Sink()
    RequestLatency(sink, "batch", arrived_s=10.0).end(40.0, "timeout")
    assert sink.firsts == [] and sink.ends == [("batch", 30.0, None, "timeout")]
