"""Headroom learned online: an upper quantile of the forecast's own errors, per volatility class.

Every tick the policy plans for the forecast peak of [now, now + lead + horizon]; the replicas it
asks for now are serving at now + lead. So each plan is a prediction that can be checked:

    score = highest rate seen over [now + lead, now + lead + horizon] / the base it was sized for

"Rate seen" is the mean over the last `score_window_s` (30 s): a burst of a few seconds that the
queue absorbs within the TTFT SLO needs no replica, and scoring each 10 s count's Poisson noise
as a forecast error would buy headroom for it in every hour.

Scores are kept for `window_s` (7 days), each with the forecast it judged (the traffic at stake)
and the traffic's recent volatility when the plan was made (autoscaling/volatility.py: the mean
jump between 10-minute means over the last half hour). They are grouped (Mondrian conformal) into
`num_volatility_classes` classes of that volatility, split at its own terciles over the window,
and optionally into `num_bands` time-of-day bands. The SLO's budget, 1 - `quantile` of the
traffic, is spent across groups where it saves the most (autoscaling/headroom_alloc.py): with
errors exchangeable within a group, sizing for forecast x headroom covers the rate for `quantile`
of the traffic, a calm hour is planned with calm hours' errors and a jumpy one with jumpy ones',
and a group with rare, huge surprises is not made to cover them at any price.

Why volatility and not time of day by default: jumps cluster in time (a jumpy hour is followed by
another), so the last half hour's volatility tells more about the next jump than the clock does. On
the frontier replay (benchmarks/autoscaling_frontier.py) three volatility classes and one band
beat six 4-hour bands on both traces (docs/autoscaling.md#the-frontier-slo-against-gpu-hours).
A trace with bigger surprises gets more headroom by itself, a calm one less, with the same
settings; no cap is picked by looking at a trace.

* A group with fewer than `min_scores` scores uses every score pooled. Plans made before any
  volatility was measured (a fresh start, a history saved before it was tracked) are a group of
  their own, until they leave the window. With fewer than `min_scores` in all, there is no learned
  headroom (the policy falls back to the R6 safety factor, 1 / target_utilization).
* A plan that falls due in a trace gap (no rate observed) is dropped, never scored.
* The SLO's own feedback (autoscaling/headroom_feedback.py, adaptive conformal inference)
  multiplies the result: up while the served traffic is in distress, down while it is not, so
  the long-run share served in distress tends to 1 - `quantile` when the week's errors mislead.
* Traffic jumpier than `extrapolate_volatility_above` (99%) of the window's scored plans (a
  change of regime) gets its group's log-headroom scaled by its volatility over that percentile
  (`volatility.extrapolated`): until the new regime's scores reach the group's tail, a headroom
  learned on calmer traffic would be too small for it.
* `class_pooling` (0: off) moves each group's log-headroom that share of the way to the pooled
  one (`headroom_alloc.pooled_towards`): partial pooling, tried in the twelfth tuning run and left
  off (docs/autoscaling.md).
* The result is clipped to `clip`: below 1 when the forecast over-predicts (its peak over a window
  is above the rate most of the time), never absurd when a few scores are wild. A lower bound
  above 1 is a floor: a uniform margin under the learned one.

`HeadroomLearner` holds the scores (like the Forecaster, an accumulator with time passed in);
`band_of`, `volatility.classes_of`, `volatility.extrapolated` and `headroom_alloc.allocate` are
the pure arithmetic, tested on their own.
The scores are split-conformal in spirit: each plan is judged on traffic it had not seen when it
was made.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from autoscaling.headroom_alloc import allocate, pooled_towards
from autoscaling.headroom_config import HeadroomConfig
from autoscaling.headroom_feedback import SloFeedback
from autoscaling.volatility import VolatilityTracker, class_of, classes_of, extrapolated

_DAY_S = 86400.0
REFRESH_S = 600.0


@dataclass(frozen=True, slots=True)
class Headroom:
    factor: float | None  # multiply the forecast by this; None: nothing learned yet
    basis: str  # how it was learned, for reasons and `status`
    num_scores: int = 0


def band_of(t_s: float, num_bands: int) -> int:
    """The time-of-day band of t_s (seconds since a midnight)."""
    return min(int((t_s % _DAY_S) // (_DAY_S / num_bands)), num_bands - 1)


class HeadroomLearner:
    """Pending plans in, scores per group, headroom out. Deterministic: time always comes in."""

    def __init__(self, cfg: HeadroomConfig | None = None) -> None:
        self.cfg = cfg or HeadroomConfig()
        # [from_s, to_s, planned-for rps, highest rate seen in the span so far, sigma at the plan]
        self._pending: deque[list[float]] = deque()
        # per band: (start_s, actual / forecast, forecast rps, sigma or NaN), oldest first
        self._bands: list[deque[tuple[float, ...]]] = [deque() for _ in range(self.cfg.num_bands)]
        self.volatility = VolatilityTracker(self.cfg.volatility_num_jumps)
        self._rates: deque[tuple[float, float]] = deque()  # (t_s, rate) within score_window_s
        # per (band, volatility class) group, and the pooled fallback; class thresholds
        self._cache: dict[tuple[int, int], Headroom] = {}
        self._pooled = Headroom(None, "not computed")
        self._thresholds: np.ndarray | None = None
        self._sigma_ref = math.nan  # extrapolate_volatility_above's quantile of their sigmas
        self._cache_key = -1  # the REFRESH_S period the cache was filled in
        self.feedback = SloFeedback()

    def expect(self, from_s: float, to_s: float, forecast_rps: float) -> None:
        """A plan sized for `forecast_rps` that must carry the rate from `from_s` to `to_s`."""
        if forecast_rps > 0 and math.isfinite(forecast_rps):
            sigma = self.volatility.sigma()
            self._pending.append(
                [from_s, to_s, forecast_rps, -1.0, math.nan if sigma is None else sigma]
            )

    def observe(self, now_s: float, rate_rps: float | None) -> None:
        """The rate seen over the interval ending now counts toward every plan whose span it
        falls in; a plan whose span has ended is scored by the highest rate seen in it."""
        self.volatility.observe(now_s, rate_rps)
        seen = rate_rps is not None and math.isfinite(rate_rps)
        if not seen:
            self._rates.clear()
        rate = self._smoothed(now_s, rate_rps) if seen else math.nan
        for plan in self._pending:
            if plan[0] > now_s:
                break  # plans are in order of start
            plan[3] = max(plan[3], rate) if seen else math.nan
        while self._pending and self._pending[0][1] <= now_s:
            start, _, planned, peak, sigma = self._pending.popleft()
            if peak >= 0:  # NaN (a gap in the span) and -1 (nothing seen) are not scored
                band = self._bands[band_of(start, self.cfg.num_bands)]
                band.append((start, peak / planned, planned, sigma))
        oldest = now_s - self.cfg.window_s
        for band in self._bands:
            while band and band[0][0] < oldest:
                band.popleft()

    def _smoothed(self, now_s: float, rate_rps: float) -> float:
        """The mean of the rates observed over the last `score_window_s`, this one included
        (a gap empties the window, so a rate from before it never counts; so does time going
        back, as a replay restarting does)."""
        if self._rates and self._rates[-1][0] > now_s:
            self._rates.clear()
        self._rates.append((now_s, float(rate_rps)))
        while len(self._rates) > 1 and self._rates[0][0] <= now_s - self.cfg.score_window_s:
            self._rates.popleft()
        return sum(r for _, r in self._rates) / len(self._rates)

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
        """The headroom for plans serving at `at_s`: its band's and the current volatility's
        class's share of the budget. Recomputed every `REFRESH_S`: sorting up to a week of
        scores is too slow for every 10 s tick."""
        key = math.floor(at_s / REFRESH_S)
        if key != self._cache_key:
            self._compute(at_s)
            self._cache_key = key
        sigma = self.volatility.sigma()
        group = (band_of(at_s, self.cfg.num_bands), class_of(_nan(sigma), self._thresholds))
        head = self._cache.get(group, self._pooled)
        if head.factor is None:
            return head
        factor, basis = head.factor, head.basis
        if self.cfg.extrapolate_volatility_above > 0 and _nan(sigma) > self._sigma_ref:
            factor = extrapolated(factor, _nan(sigma), self._sigma_ref)
            basis += f", volatility {sigma:.3g} past the window's {self._sigma_ref:.3g}"
        fb = self.feedback.factor
        if fb != 1.0:
            factor, basis = factor * fb, f"{basis}, x {fb:.2f} SLO feedback"
        if factor == head.factor:
            return head
        lo, hi = self.cfg.clip
        return Headroom(min(max(factor, lo), hi), basis, head.num_scores)

    def _compute(self, at_s: float) -> None:
        cfg = self.cfg
        pooled = [x for b in self._bands for x in b]
        self._cache, self._thresholds, self._sigma_ref = {}, None, math.nan
        if len(pooled) < cfg.min_scores:
            why = f"{len(pooled)} scores, < {cfg.min_scores}: not learned"
            self._pooled = Headroom(None, why, len(pooled))
            return
        arr = np.array([x[:4] for x in pooled])  # start, ratio, forecast, sigma per score
        starts, ratios, weights, sigmas = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
        known = sigmas[np.isfinite(sigmas)]
        self._sigma_ref = self._reference(sigmas[starts < at_s - cfg.extrapolate_reference_lag_s])
        k = cfg.num_volatility_classes
        if k > 1 and len(known) >= cfg.min_scores:
            self._thresholds = np.quantile(known, [i / k for i in range(1, k)])
        classes = classes_of(sigmas, self._thresholds)
        bands = np.repeat(np.arange(cfg.num_bands), [len(b) for b in self._bands])
        keys = bands * (k + 1) + classes + 1  # one integer per (band, class) group
        found, counts = np.unique(keys, return_counts=True)
        own = [int(g) for g, n in zip(found, counts, strict=True) if n >= cfg.min_scores]
        groups = {g: (ratios[keys == g], weights[keys == g]) for g in own}
        spent = allocate([groups[g] for g in own], cfg.quantile) if own else []
        # a group with too few scores of its own: every score at the plain quantile
        lo, hi = cfg.clip
        pooled_value = allocate([(ratios, weights)], cfg.quantile)[0]
        basis = (
            f"{len(pooled)} actual/forecast ratios (all pooled), q{cfg.quantile:g} of all traffic"
        )
        self._pooled = Headroom(min(max(pooled_value, lo), hi), basis, len(pooled))
        for g, value in zip(own, spent, strict=True):
            group = (g // (k + 1), g % (k + 1) - 1)
            n = len(groups[g][0])
            where = self._where(group)
            basis = f"{n} actual/forecast ratios ({where}), q{cfg.quantile:g} of all traffic"
            if cfg.class_pooling > 0:
                # both clipped first: a score can be 0 (no traffic), whose log is not finite
                pooled_h = self._pooled.factor
                value = pooled_towards(min(max(value, lo), hi), pooled_h, cfg.class_pooling)
                basis += f", {cfg.class_pooling:g} of the way to the pooled {pooled_h:.3g}"
            self._cache[group] = Headroom(min(max(value, lo), hi), basis, n)

    def _reference(self, sigmas: np.ndarray) -> float:
        """extrapolate_volatility_above's quantile of these plans' volatility (NaN: none)."""
        above, known = self.cfg.extrapolate_volatility_above, sigmas[np.isfinite(sigmas)]
        return float(np.quantile(known, above)) if above and len(known) else math.nan

    def _where(self, group: tuple[int, int]) -> str:
        band, cls = group
        parts = [f"band {band} of {self.cfg.num_bands}"] if self.cfg.num_bands > 1 else []
        if cls >= 0:
            parts.append(f"volatility class {cls + 1} of {self.cfg.num_volatility_classes}")
        return ", ".join(parts) or "all scores"

    # ----- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        cfg = asdict(self.cfg)
        cfg["clip"] = list(self.cfg.clip)
        cfg["feedback_range"] = list(self.cfg.feedback_range)
        return {
            "feedback": self.feedback.to_dict(),
            "volatility": self.volatility.to_dict(),
            "config": cfg,
            "pending": [list(x) for x in self._pending],
            "rates": [list(x) for x in self._rates],
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
        learner.volatility = VolatilityTracker.from_dict(
            d.get("volatility"), learner.cfg.volatility_num_jumps
        )
        learner._rates.extend((float(t), float(r)) for t, r in d.get("rates", []))
        # histories saved before volatility was tracked: their plans and scores have no sigma
        learner._pending.extend(_with_sigma(plan, 5) for plan in d["pending"])
        for band, items in zip(learner._bands, d["bands"], strict=True):
            band.extend(tuple(_with_sigma(x, 4)) for x in items)
        return learner


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _with_sigma(values: list, length: int) -> list[float]:
    out = [float(v) for v in values]
    return out + [math.nan] * (length - len(out))
