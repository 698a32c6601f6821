"""Headroom learned online: a conformal upper quantile of the forecast's own errors.

Every tick the policy plans for the forecast peak of [now, now + lead + horizon]; the replicas it
asks for now are serving at now + lead. So each plan is a prediction that can be checked:

    score = observed rate at now + lead / the forecast peak the plan was sized for

Scores are kept per time-of-day band (`num_bands` bands, 4 h each by default), for `window_s`
(7 days). The headroom for a band is the split-conformal quantile of its scores at `quantile`:
with exchangeable errors, sizing for forecast x headroom covers the rate `quantile` of the time.
A trace with bigger surprises (m-large's bursty clients) gets more headroom by itself, a calm one
less, with the same settings; no cap is picked by looking at a trace.

* A band with fewer than `min_scores` scores uses every band's scores pooled; with fewer than
  `min_scores` in all, there is no learned headroom (the policy falls back to the R6 safety
  factor, 1 / target_utilization).
* A plan that falls due in a trace gap (no rate observed) is dropped, never scored.
* The result is clipped to `clip`: below 1 when the forecast over-predicts (its peak over a window
  is above the rate most of the time), never absurd when a few scores are wild.

`HeadroomLearner` holds the scores (like the Forecaster, an accumulator with time passed in);
`conformal_quantile` and `band_of` are the pure arithmetic, tested on their own.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from common.validate import check_range

_DAY_S = 86400.0
REFRESH_S = 600.0


@dataclass(frozen=True, slots=True)
class HeadroomConfig:
    _owner = "HeadroomConfig"

    quantile: float = 0.99  # share of planned-for moments the capacity should cover
    num_bands: int = 6  # time-of-day bands; errors at 3 am differ from errors at 8 pm
    window_s: float = 7 * _DAY_S  # scores older than this drop out (a week: every weekday)
    min_scores: int = 50  # per band before the band's own quantile is used
    clip: tuple[float, float] = (0.5, 4.0)

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


@dataclass(frozen=True, slots=True)
class Headroom:
    factor: float | None  # multiply the forecast by this; None: nothing learned yet
    basis: str  # how it was learned, for reasons and `status`
    num_scores: int = 0


def band_of(t_s: float, num_bands: int) -> int:
    """The time-of-day band of t_s (seconds since a midnight)."""
    return min(int((t_s % _DAY_S) // (_DAY_S / num_bands)), num_bands - 1)


def conformal_quantile(scores: list[float], quantile: float) -> float:
    """Split-conformal upper quantile: the ceil((n + 1) q)-th smallest score (the largest when
    that is past the end). A new exchangeable score is <= it with probability >= q."""
    if not scores:
        raise ValueError("conformal_quantile needs at least one score")
    ordered = sorted(scores)
    k = math.ceil((len(ordered) + 1) * quantile) - 1
    return ordered[min(max(k, 0), len(ordered) - 1)]


class HeadroomLearner:
    """Pending plans in, scores per band, headroom out. Deterministic: time always comes in."""

    def __init__(self, cfg: HeadroomConfig | None = None) -> None:
        self.cfg = cfg or HeadroomConfig()
        # [from_s, to_s, planned-for rps, highest rate seen in the span so far]
        self._pending: deque[list[float]] = deque()
        self._bands: list[deque[tuple[float, float]]] = [deque() for _ in range(self.cfg.num_bands)]
        self._cache: dict[int, Headroom] = {}
        self._cache_key = -1  # the REFRESH_S period the cache was filled in

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
                band.append((start, peak / planned))
        oldest = now_s - self.cfg.window_s
        for band in self._bands:
            while band and band[0][0] < oldest:
                band.popleft()

    def num_scores(self) -> int:
        return sum(len(b) for b in self._bands)

    def headroom(self, at_s: float) -> Headroom:
        """The headroom for plans serving at `at_s` (its band's quantile). Recomputed every
        `REFRESH_S`: a sort of up to a week of scores is too slow for every 10 s tick."""
        key = math.floor(at_s / REFRESH_S)
        if key != self._cache_key:
            self._cache, self._cache_key = {}, key
        band = band_of(at_s, self.cfg.num_bands)
        if band not in self._cache:
            self._cache[band] = self._compute(band)
        return self._cache[band]

    def _compute(self, band: int) -> Headroom:
        cfg = self.cfg
        own = [r for _, r in self._bands[band]]
        where = f"band {band} of {cfg.num_bands}"
        if len(own) < cfg.min_scores:
            own = [r for b in self._bands for _, r in b]
            where = "all bands pooled"
        if len(own) < cfg.min_scores:
            return Headroom(None, f"{len(own)} scores, < {cfg.min_scores}: not learned", len(own))
        lo, hi = cfg.clip
        value = min(max(conformal_quantile(own, cfg.quantile), lo), hi)
        basis = f"q{cfg.quantile:g} of {len(own)} actual/forecast ratios ({where})"
        return Headroom(value, basis, len(own))

    # ----- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        cfg = asdict(self.cfg)
        cfg["clip"] = list(self.cfg.clip)
        return {
            "config": cfg,
            "pending": [list(x) for x in self._pending],
            "bands": [[list(x) for x in b] for b in self._bands],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HeadroomLearner:
        cfg = dict(d["config"])
        cfg["clip"] = tuple(cfg["clip"])
        learner = cls(HeadroomConfig(**cfg))
        learner._pending.extend([float(x) for x in plan] for plan in d["pending"])
        for band, items in zip(learner._bands, d["bands"], strict=True):
            band.extend((float(t), float(r)) for t, r in items)
        return learner
