"""Headroom learned online: an upper quantile of the forecast's own errors, per time of day.

Every tick the policy plans for the forecast peak of [now, now + lead + horizon]; the replicas it
asks for now are serving at now + lead. So each plan is a prediction that can be checked:

    score = highest rate seen over [now + lead, now + lead + horizon] / the base it was sized for

Scores are kept per time-of-day band (`num_bands` bands, 4 h each by default), for `window_s`
(7 days), each with the forecast it judged (the traffic at stake). The SLO's budget, 1 - `quantile`
of the traffic, is spent across bands where it saves the most (autoscaling/headroom_alloc.py):
with exchangeable errors, sizing for forecast x headroom covers the rate for `quantile` of the
traffic, and a band with rare, huge surprises is not made to cover them at any price.
A trace with bigger surprises gets more headroom by itself, a calm one less, with the same
settings; no cap is picked by looking at a trace.

* A band with fewer than `min_scores` scores uses every band's scores pooled; with fewer than
  `min_scores` in all, there is no learned headroom (the policy falls back to the R6 safety
  factor, 1 / target_utilization).
* A plan that falls due in a trace gap (no rate observed) is dropped, never scored.
* The SLO's own feedback (autoscaling/headroom_feedback.py, adaptive conformal inference)
  multiplies the result: up while the served traffic is in distress, down while it is not, so
  the long-run share served in distress tends to 1 - `quantile` when the week's errors mislead.
* The result is clipped to `clip`: below 1 when the forecast over-predicts (its peak over a window
  is above the rate most of the time), never absurd when a few scores are wild.

`HeadroomLearner` holds the scores (like the Forecaster, an accumulator with time passed in);
`band_of` and `headroom_alloc.allocate` are the pure arithmetic, tested on their own. The scores
are split-conformal in spirit: each plan is judged on traffic it had not seen when it was made.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autoscaling.headroom_alloc import allocate
from autoscaling.headroom_feedback import SloFeedback
from common.validate import check_range

_DAY_S = 86400.0
REFRESH_S = 600.0


@dataclass(frozen=True, slots=True)
class HeadroomConfig:
    _owner = "HeadroomConfig"

    # share of planned-for spans the capacity should cover: the SLO's own target share (99.5%)
    quantile: float = 0.995
    num_bands: int = 6  # time-of-day bands; errors at 3 am differ from errors at 8 pm
    window_s: float = 7 * _DAY_S  # scores older than this drop out (a week: every weekday)
    min_scores: int = 50  # per band before the band's own quantile is used
    clip: tuple[float, float] = (0.5, 4.0)
    # the SLO's feedback on that headroom (autoscaling/headroom_feedback.py): log-headroom moved
    # per second of mean traffic, up when served in distress, down otherwise; 0 turns it off
    feedback_gain_per_s: float = 1e-4
    feedback_range: tuple[float, float] = (0.6, 2.0)  # bounds on the feedback's factor

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "quantile", self.quantile, 0.5, 1.0, lo_open=True)
        check_range(o, "num_bands", self.num_bands, 1, 96, integer=True)
        if _DAY_S % self.num_bands:
            raise ValueError(f"{o}.num_bands={self.num_bands!r} must divide a day evenly")
        check_range(o, "window_s", self.window_s, 60.0, 56 * _DAY_S)
        check_range(o, "min_scores", self.min_scores, 1, None, integer=True)
        lo, hi = self.clip
        check_range(o, "clip[0]", lo, 0.0, 1.0, lo_open=True)
        check_range(o, "clip[1]", hi, 1.0, 100.0)
        check_range(o, "feedback_gain_per_s", self.feedback_gain_per_s, 0.0, 1.0)
        lo, hi = self.feedback_range
        check_range(o, "feedback_range[0]", lo, 0.0, 1.0, lo_open=True)
        check_range(o, "feedback_range[1]", hi, 1.0, 100.0)


@dataclass(frozen=True, slots=True)
class Headroom:
    factor: float | None  # multiply the forecast by this; None: nothing learned yet
    basis: str  # how it was learned, for reasons and `status`
    num_scores: int = 0


def band_of(t_s: float, num_bands: int) -> int:
    """The time-of-day band of t_s (seconds since a midnight)."""
    return min(int((t_s % _DAY_S) // (_DAY_S / num_bands)), num_bands - 1)


class HeadroomLearner:
    """Pending plans in, scores per band, headroom out. Deterministic: time always comes in."""

    def __init__(self, cfg: HeadroomConfig | None = None) -> None:
        self.cfg = cfg or HeadroomConfig()
        # [from_s, to_s, planned-for rps, highest rate seen in the span so far]
        self._pending: deque[list[float]] = deque()
        # per band: (start_s, actual / forecast, forecast rps), oldest first
        self._bands: list[deque[tuple[float, ...]]] = [deque() for _ in range(self.cfg.num_bands)]
        self._cache: list[Headroom] = []
        self._cache_key = -1  # the REFRESH_S period the cache was filled in
        self.feedback = SloFeedback()

    def expect(self, from_s: float, to_s: float, forecast_rps: float) -> None:
        """A plan sized for `forecast_rps` that must carry the rate from `from_s` to `to_s`."""
        if forecast_rps > 0 and math.isfinite(forecast_rps):
            self._pending.append([from_s, to_s, forecast_rps, -1.0])

    def observe(self, now_s: float, rate_rps: float | None) -> None:
        """The rate seen over the interval ending now counts toward every plan whose span it
        falls in; a plan whose span has ended is scored by the highest rate seen in it."""
        seen = rate_rps is not None and math.isfinite(rate_rps)
        for plan in self._pending:
            if plan[0] > now_s:
                break  # plans are in order of start
            plan[3] = max(plan[3], float(rate_rps)) if seen else math.nan
        while self._pending and self._pending[0][1] <= now_s:
            start, _, planned, peak = self._pending.popleft()
            if peak >= 0:  # NaN (a gap in the span) and -1 (nothing seen) are not scored
                band = self._bands[band_of(start, self.cfg.num_bands)]
                band.append((start, peak / planned, planned))
        oldest = now_s - self.cfg.window_s
        for band in self._bands:
            while band and band[0][0] < oldest:
                band.popleft()

    def feedback_on(self, now_s: float, rate_rps: float | None, distressed: bool) -> None:
        """What the SLO got over the interval ending now: `distressed` when the queue passed the
        emergency limit (the SLO's misses). Moves the feedback factor on the headroom."""
        lo, hi = self.cfg.feedback_range
        self.feedback.update(
            now_s,
            rate_rps,
            distressed,
            1.0 - self.cfg.quantile,
            self.cfg.feedback_gain_per_s,
            (math.log(lo), math.log(hi)),
        )

    def num_scores(self) -> int:
        return sum(len(b) for b in self._bands)

    def headroom(self, at_s: float) -> Headroom:
        """The headroom for plans serving at `at_s` (its band's share of the budget). Recomputed
        every `REFRESH_S`: sorting up to a week of scores is too slow for every 10 s tick."""
        key = math.floor(at_s / REFRESH_S)
        if key != self._cache_key:
            self._cache, self._cache_key = self._compute(), key
        head = self._cache[band_of(at_s, self.cfg.num_bands)]
        fb = self.feedback.factor
        if head.factor is None or fb == 1.0:
            return head
        lo, hi = self.cfg.clip
        basis = f"{head.basis}, x {fb:.2f} SLO feedback"
        return Headroom(min(max(head.factor * fb, lo), hi), basis, head.num_scores)

    def _compute(self) -> list[Headroom]:
        cfg = self.cfg
        pooled = [x for b in self._bands for x in b]
        if len(pooled) < cfg.min_scores:
            why = f"{len(pooled)} scores, < {cfg.min_scores}: not learned"
            return [Headroom(None, why, len(pooled))] * cfg.num_bands
        own = [i for i, band in enumerate(self._bands) if len(band) >= cfg.min_scores]
        spent = allocate([self._arrays(self._bands[i]) for i in own], cfg.quantile) if own else []
        values = dict(zip(own, spent, strict=True))
        # a band with too few scores of its own: every band's scores at the plain quantile
        pooled_value = allocate([self._arrays(pooled)], cfg.quantile)[0]
        lo, hi = cfg.clip
        out = []
        for i, band in enumerate(self._bands):
            n, where = (len(band), f"band {i} of {cfg.num_bands}") if i in values else (
                len(pooled), "all bands pooled")  # fmt: skip
            basis = f"{n} actual/forecast ratios ({where}), q{cfg.quantile:g} of all traffic"
            out.append(Headroom(min(max(values.get(i, pooled_value), lo), hi), basis, n))
        return out

    @staticmethod
    def _arrays(scores) -> tuple[np.ndarray, np.ndarray]:
        return np.array([x[1] for x in scores]), np.array([x[2] for x in scores])

    # ----- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        cfg = asdict(self.cfg)
        cfg["clip"] = list(self.cfg.clip)
        cfg["feedback_range"] = list(self.cfg.feedback_range)
        return {
            "feedback": self.feedback.to_dict(),
            "config": cfg,
            "pending": [list(x) for x in self._pending],
            "bands": [[list(x) for x in b] for b in self._bands],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadroomLearner:
        cfg = dict(d["config"])
        cfg["clip"] = tuple(cfg["clip"])
        if "feedback_range" in cfg:  # histories saved before the feedback take its defaults
            cfg["feedback_range"] = tuple(cfg["feedback_range"])
        learner = cls(HeadroomConfig(**cfg))
        learner.feedback = SloFeedback.from_dict(d.get("feedback"))
        learner._pending.extend([float(x) for x in plan] for plan in d["pending"])
        for band, items in zip(learner._bands, d["bands"], strict=True):
            band.extend(tuple(float(v) for v in x) for x in items)
        return learner
