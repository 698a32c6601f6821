"""The TTFT margin the ingress measures: how much later than its replica predicted a first token
reaches the ingress. Pure, no Ray; time is passed in.

A replica predicts TTFT from its own queue and step timings (serving/llm/ttft.py). It cannot see
the time its engine loses to other processes on shared cores, the hop back to the ingress, or
the ingress's own event loop, and those grow with the load: at 10x the capacity on 2 shared
cores, replicas that predicted at most 0.48 s saw first tokens reach the ingress up to 1.1 s
after dispatch (benchmarks/hardening.py runs, docs/serving.md#the-measured-margin).

So for every admitted request the ingress records its excess, the time from dispatch to the
first item at the ingress less the replica's prediction, per pool, and sizes the margin as a
split-conformal upper quantile of the recent excesses: if excesses are exchangeable, a new
request's excess stays at or below the k-th smallest of n with probability k / (n + 1), so
k = ceil((n + 1) x quantile) (the largest when n is small). The replica then admits a request
only if its prediction fits ttft_p99_s - spent - margin (serving/llm/admission.py
`ttft_budget_s`), where the margin is never below the tier's fixed share of the SLO: the
measured margin tightens admission under load, it never loosens the configured one.

Samples expire after `max_age_s`: an overload's excesses must not refuse requests long after
it ended (with free slots a request is admitted anyway, so a stale margin costs little).
"""

from __future__ import annotations

import math
from collections import deque

QUANTILE = 0.99  # the SLO is a p99
MAX_SAMPLES = 200
MAX_AGE_S = 60.0
MIN_SAMPLES = 10  # below it the margin is unknown: the tier's fixed share stands alone


def conformal_upper(values: list[float], quantile: float) -> float:
    """The k-th smallest of `values`, k = ceil((n + 1) x quantile), capped at the largest."""
    ordered = sorted(values)
    k = min(math.ceil((len(ordered) + 1) * quantile), len(ordered))
    return ordered[k - 1]


class TtftMargins:
    """Recent (time, excess) samples per pool and the margin they imply."""

    def __init__(
        self,
        quantile: float = QUANTILE,
        max_samples: int = MAX_SAMPLES,
        max_age_s: float = MAX_AGE_S,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile={quantile} must be in (0, 1)")
        if min_samples < 1 or max_samples < min_samples:
            raise ValueError(
                f"min_samples={min_samples}, max_samples={max_samples}: need "
                "1 <= min_samples <= max_samples"
            )
        self.quantile = quantile
        self.max_age_s = max_age_s
        self.min_samples = min_samples
        self.max_samples = max_samples
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, pool: str, excess_s: float, now: float) -> None:
        """One admitted request's first item reached the ingress `excess_s` later than its
        replica predicted (negative: earlier)."""
        samples = self._samples.setdefault(pool, deque(maxlen=self.max_samples))
        samples.append((now, excess_s))

    def margin_s(self, pool: str, now: float) -> float | None:
        """The measured margin for `pool` (>= 0), or None while too few recent samples exist."""
        samples = self._samples.get(pool)
        if not samples:
            return None
        while samples and samples[0][0] < now - self.max_age_s:
            samples.popleft()
        if len(samples) < self.min_samples:
            return None
        return max(conformal_upper([e for _, e in samples], self.quantile), 0.0)
