"""How long an interactive request may wait for a replica slot: no standing queue under
overload. Pure, no Ray; time is passed in.

A request that waits for a slot on a replica buys throughput only if that slot would otherwise
stand idle. When requests arrive faster than slots free, the next arrival takes a freed slot
within one arrival gap anyway, so a request queued behind the running ones adds its wait to its
own TTFT and nothing to the replica's output. So the ingress bounds the wait it lets a replica
queue an interactive request for: the time `ARRIVALS_AHEAD` more arrivals take at the rate the
ingress sees now. At 3 req/s (the overload app's capacity) that is 0.67 s, above the TTFT
budget, and changes nothing; at 10x it is 0.07 s, and only requests that find a slot about to
free are admitted.

Measured at 10x capacity on the overload app (benchmarks/hardening.py; docs/serving.md): the
requests that missed the 1.0 s SLO had all been queued behind a running batch with a predicted
TTFT near the budget, and on 2 shared cores their slots freed up to 3x later than predicted.

Only the interactive tier is bounded (`WAIT_BOUNDED_TIERS`): the tiers below it trade latency
for throughput by design (their budgets are 10 s and more), and refusing a queued request costs
its client a retry and the front door a refusal, which is what a flood of them must not do.
Below `MIN_ARRIVALS` in the window the rate is unknown and no bound applies: the TTFT budget
alone decides (serving/llm/admission.py).
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 2.0  # the rate is what arrived in the last WINDOW_S
MIN_ARRIVALS = 4  # fewer in the window: the rate is a guess, no bound
ARRIVALS_AHEAD = 2  # a wait of two arrival gaps: one arrival may be refused or go elsewhere
WAIT_BOUNDED_TIERS = frozenset({"interactive"})


class ArrivalRate:
    """Arrivals per tier over the last `window_s`, and the wait bound they imply."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        min_arrivals: int = MIN_ARRIVALS,
        arrivals_ahead: float = ARRIVALS_AHEAD,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s={window_s} must be > 0")
        if min_arrivals < 1:
            raise ValueError(f"min_arrivals={min_arrivals} must be >= 1")
        if arrivals_ahead <= 0:
            raise ValueError(f"arrivals_ahead={arrivals_ahead} must be > 0")
        self.window_s = window_s
        self.min_arrivals = min_arrivals
        self.arrivals_ahead = arrivals_ahead
        self._times: dict[str, deque[float]] = {}

    def arrive(self, tier: str, now: float) -> None:
        self._times.setdefault(tier, deque()).append(now)

    def rate_per_s(self, tier: str, now: float) -> float:
        times = self._times.get(tier)
        if not times:
            return 0.0
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return len(times) / self.window_s

    def max_wait_s(self, tier: str, now: float) -> float | None:
        """The longest a request of `tier` arriving now may wait for a slot; None: no bound."""
        if tier not in WAIT_BOUNDED_TIERS:
            return None
        rate = self.rate_per_s(tier, now)
        if rate * self.window_s < self.min_arrivals:
            return None
        return self.arrivals_ahead / rate
