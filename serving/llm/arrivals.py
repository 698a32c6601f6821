"""How long an interactive request may wait for a replica slot: no standing queue under
overload. Pure, no Ray; time is passed in.

A request that waits for a slot on a replica buys throughput only if that slot would otherwise
stand idle. While more requests arrive than the slots take, a slot that frees is taken by the
next arrival within one arrival gap, so a request queued behind the running ones adds its wait
to its own TTFT and nothing to the replica's output. So while the ingress is turning a tier's
requests away, it bounds the wait it lets a replica queue the next one for: the time
`ARRIVALS_AHEAD` more arrivals take at the rate it sees now. At 10x the overload app's capacity
(30 req/s) that is 0.07 s, and only requests that find a slot about to free are admitted.

The refusals decide whether the bound applies at all: they are the evidence that more requests
come than the slots take (at least `MIN_REFUSALS` within the window). A burst the replicas queue
within the TTFT budget is not refused, so it gets no bound: after a burst, no arrival may come
to refill a slot, and its queued requests would have been served in time.

Measured at 10x capacity on the overload app (benchmarks/hardening.py; docs/serving.md): the
requests that missed the 1.0 s SLO had all been queued behind a running batch with a predicted
TTFT near the budget, and on 2 shared cores their slots freed up to 3x later than predicted.

Only the interactive tier is bounded (`WAIT_BOUNDED_TIERS`): the tiers below it trade latency
for throughput by design (their budgets are 10 s and more), and refusing a queued request costs
its client a retry and the front door a refusal, which is what a flood of them must not do.
Without the bound the TTFT budget alone decides (serving/llm/admission.py).
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 2.0  # rates are what happened in the last WINDOW_S
MIN_REFUSALS = 4  # fewer refused in the window: not a sustained overload, no bound
ARRIVALS_AHEAD = 2  # a wait of two arrival gaps: the next arrival may go to another replica
WAIT_BOUNDED_TIERS = frozenset({"interactive"})


class _Window:
    """Event times of the last `window_s`. Old ones go on every add as well as every count: a
    tier nobody asks about (the lower tiers; interactive before its first refusal) must not
    grow without bound in a long-lived ingress."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        self._times.append(now)
        self._forget_before(now)

    def count(self, now: float) -> int:
        self._forget_before(now)
        return len(self._times)

    def _forget_before(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()


class WaitBound:
    """Arrivals and refusals per tier over the last `window_s`, and the wait bound they imply
    for the next request of that tier."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        min_refusals: int = MIN_REFUSALS,
        arrivals_ahead: float = ARRIVALS_AHEAD,
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s={window_s} must be > 0")
        if min_refusals < 1:
            raise ValueError(f"min_refusals={min_refusals} must be >= 1")
        if arrivals_ahead <= 0:
            raise ValueError(f"arrivals_ahead={arrivals_ahead} must be > 0")
        self.window_s = window_s
        self.min_refusals = min_refusals
        self.arrivals_ahead = arrivals_ahead
        self._arrived: dict[str, _Window] = {}
        self._refused: dict[str, _Window] = {}

    def arrived(self, tier: str, now: float) -> None:
        self._arrived.setdefault(tier, _Window(self.window_s)).add(now)

    def refused(self, tier: str, now: float) -> None:
        self._refused.setdefault(tier, _Window(self.window_s)).add(now)

    def arrival_rate_per_s(self, tier: str, now: float) -> float:
        window = self._arrived.get(tier)
        return 0.0 if window is None else window.count(now) / self.window_s

    def max_wait_s(self, tier: str, now: float) -> float | None:
        """The longest a request of `tier` arriving now may wait for a slot; None: no bound."""
        refused = self._refused.get(tier)
        if tier not in WAIT_BOUNDED_TIERS or refused is None:
            return None
        if refused.count(now) < self.min_refusals:
            return None
        rate = self.arrival_rate_per_s(tier, now)  # >= the refusal rate when both are counted
        return self.arrivals_ahead / rate if rate > 0 else None
