"""The SLO's own feedback on the headroom: adaptive conformal inference on the served traffic.

The conformal headroom (autoscaling/headroom.py) covers `quantile` of the forecast's errors as
they were over the last week. When the traffic turns more volatile than that week (m-small's
days 10-12: jumps of 1.5-1.8x between 10-minute windows where the training week had 1.1x), or
calmer, the week's quantile is wrong for a while, and the SLO pays (or the GPU bill does). The
feedback corrects the level from what the SLO actually got, tick by tick:

    theta    += gain x (rate / mean rate) x dt x (distressed - (1 - quantile))
    headroom  = conformal headroom x exp(theta),  exp(theta) within `feedback_range`

`distressed` is the emergency test (queue wait or depth past half the TTFT SLO): the ticks whose
requests miss the SLO. This is Gibbs & Candes' adaptive conformal inference (ACI, 2021) run on
the headroom's log: whatever the traffic does, the long-run traffic share served in distress
tends to 1 - quantile (the bound on the gap shrinks as 1 / (gain x time)), so one setting fits a
calm trace and a volatile one. Each distressed second of mean traffic raises the headroom by
`gain` x quantile; each calm second lowers it by `gain` x (1 - quantile): a miss costs
quantile / (1 - quantile) calm seconds of relaxation (199 at 0.995), so a burst's extra headroom
is paid back over hours, not held for a week.

The weight `rate / mean rate` counts traffic, not time (the SLO is a share of requests); the mean
is an exponential average over `MEAN_TAU_S`. Pure arithmetic, time passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MEAN_TAU_S = 86400.0  # the traffic weight's reference: the mean rate over about a day
MAX_STEP_S = 60.0  # a longer silence (a restart, a gap) counts as this long
MAX_WEIGHT = 5.0  # one tick of a 10x spike weighs like 5 of mean traffic


@dataclass(slots=True)
class SloFeedback:
    """theta: the log of the factor on the conformal headroom; mean_rps: the traffic reference."""

    theta: float = 0.0
    mean_rps: float | None = None
    last_s: float | None = None

    def update(
        self,
        now_s: float,
        rate_rps: float | None,
        distressed: bool,
        target_miss: float,
        gain_per_s: float,
        log_range: tuple[float, float],
    ) -> None:
        """One tick's outcome: `distressed` over the interval ending at now_s (rate None: a gap,
        nothing is learned)."""
        dt = 0.0 if self.last_s is None else min(max(now_s - self.last_s, 0.0), MAX_STEP_S)
        self.last_s = now_s
        if rate_rps is None or not math.isfinite(rate_rps) or rate_rps < 0 or dt <= 0:
            return
        if self.mean_rps is None:
            self.mean_rps = rate_rps
        else:
            keep = math.exp(-dt / MEAN_TAU_S)
            self.mean_rps = keep * self.mean_rps + (1.0 - keep) * rate_rps
        weight = min(rate_rps / self.mean_rps, MAX_WEIGHT) if self.mean_rps > 0 else 1.0
        step = gain_per_s * weight * dt * (float(distressed) - target_miss)
        lo, hi = log_range
        self.theta = min(max(self.theta + step, lo), hi)

    @property
    def factor(self) -> float:
        return math.exp(self.theta)

    def to_dict(self) -> dict[str, Any]:
        return {"theta": self.theta, "mean_rps": self.mean_rps, "last_s": self.last_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SloFeedback:
        if not d:  # a history saved before the feedback existed
            return cls()
        mean, last = d.get("mean_rps"), d.get("last_s")
        return cls(
            theta=float(d.get("theta", 0.0)),
            mean_rps=None if mean is None else float(mean),
            last_s=None if last is None else float(last),
        )
