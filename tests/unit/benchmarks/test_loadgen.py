"""The load generator's summary: why the server refused, counted without the numbers."""

from __future__ import annotations

from benchmarks.loadgen import Outcome, refusal_reasons, summarize


def refused(reason: str) -> Outcome:
    return Outcome("interactive", 429, 0.0, 0.01, retry_after="1", error=reason)


def test_alike_refusals_add_up_whatever_their_numbers():
    outcomes = [
        refused("hot: interactive: predicted TTFT 0.62 s exceeds the budget 0.50 s"),
        refused("hot: interactive: predicted TTFT 0.71 s exceeds the budget 0.48 s"),
        refused("hot: interactive: queue full (8 waiting)"),
        Outcome("interactive", 200, 0.0, 0.2, ttft_s=0.05, num_chunks=3),
    ]
    assert refusal_reasons(outcomes) == {
        "hot: interactive: predicted TTFT N s exceeds the budget N s": 2,
        "hot: interactive: queue full (N waiting)": 1,
    }
    tier = summarize(outcomes, 1.0)["interactive"]
    assert tier["statuses"] == {"429": 3, "200": 1}
    assert tier["refusal_reasons"]["hot: interactive: queue full (N waiting)"] == 1
