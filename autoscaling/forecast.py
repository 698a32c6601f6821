"""Request-rate forecaster: a time-of-day profile scaled by the recent level (pure, time passed in).

    forecast(t) = profile(t) x level_ratio

* profile(t): for the bin of t (bin_s wide, 10 min by default), the mean rate of that bin and its
  two neighbours on each of the last `profile_days` days, linearly interpolated between bin centres.
  Once `weekly_min_days` (14) days of history exist it is the average of that daily profile and a
  day-of-week profile (same bin, same weekday, last two weeks).
* level_ratio: observed mean rate over the last `level_window_s` / the profile over the same
  observations, clipped to `ratio_clip`. It carries the day's overall level (a busy Monday) into
  the shape learned from earlier days.
* forecast(t) = profile_weight x that + (1 - profile_weight) x the rate of the last
  `carry_window_s` carried along the profile's shape (profile(t) / profile(now)): the share that
  trusts what is happening now, not the day's level, so that in a fall the forecast falls with
  the rate instead of holding the level window's mean.
* Missing windows (rate None or NaN, e.g. ServeGen's all-zero collection gaps) are not observed at
  all: they neither pull the profile down nor count as recent level. A bin missing on every profile
  day falls back to its neighbours, then to the recent level (last-value).
* What the forecast cannot see coming (a 10-minute burst) is the headroom's job: the policy
  multiplies the forecast by an upper quantile of its own errors (autoscaling/headroom.py).

The controller persists `to_dict()` and restores with `from_dict()`; history older than
`max_history_days` is dropped, so the dict stays small (about 4 k bins).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from common.validate import check_range

_DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    _owner = "ForecastConfig"

    bin_s: float = 600.0  # profile resolution; ServeGen publishes 10-minute windows
    profile_days: int = 7  # days averaged per bin of the daily profile
    weekly_min_days: int = 14  # history needed before the day-of-week profile is blended in
    level_window_s: float = 1200.0  # recent window whose level scales the profile
    ratio_clip: tuple[float, float] = (0.25, 4.0)
    # forecast = w x profile-shaped + (1 - w) x recent level: the profile's shape is trusted only
    # this much, because a day's shape repeats only partly (m-large: lag-24 h autocorr 0.09);
    # half, chosen on the validation splits over 0.3, 0.7 and 0.9 (fit_on.FIT_ON)
    profile_weight: float = 0.5
    # the recent rate the (1 - profile_weight) share carries along the shape; 0: the level window
    carry_window_s: float = 60.0
    max_history_days: int = 28

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "bin_s", self.bin_s, 1.0, _DAY_S)
        if _DAY_S % self.bin_s:
            raise ValueError(f"{o}.bin_s={self.bin_s!r} must divide a day (86400 s) evenly")
        check_range(o, "profile_days", self.profile_days, 1, 56, integer=True)
        check_range(o, "weekly_min_days", self.weekly_min_days, 7, 56, integer=True)
        check_range(o, "level_window_s", self.level_window_s, 1.0, _DAY_S)
        lo, hi = self.ratio_clip
        check_range(o, "ratio_clip[0]", lo, 0.0, 1.0, lo_open=True)
        check_range(o, "ratio_clip[1]", hi, 1.0, None)
        check_range(o, "profile_weight", self.profile_weight, 0.0, 1.0)
        check_range(o, "carry_window_s", self.carry_window_s, 0.0, self.level_window_s)
        check_range(o, "max_history_days", self.max_history_days, 1, 365, integer=True)


@dataclass(frozen=True, slots=True)
class Forecast:
    rate_at_lead_rps: float  # forecast rate at now + lead
    peak_rps: float  # max forecast over [now, now + lead + horizon]
    basis: str  # how it was made, for reasons and `status`
    level_rps: float = 0.0  # mean observed rate over the level window (0.0 without observations)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


class Forecaster:
    """Accumulates observed rates into bins; predicts from a profile x recent level."""

    def __init__(self, cfg: ForecastConfig | None = None) -> None:
        self.cfg = cfg or ForecastConfig()
        self._bins_per_day = round(_DAY_S / self.cfg.bin_s)
        self._sum: dict[int, float] = {}  # bin index -> sum of observed rates
        self._num: dict[int, int] = {}  # bin index -> number of observations
        self._first_bin: int | None = None
        # (t_s, rate, profile at t_s or 0.0) within the level window, with running sums
        self._recent: deque[tuple[float, float, float]] = deque()
        self._sums = [0.0, 0.0, 0.0]  # rates, rates where profiled, profile values
        self._last_ratio = 1.0
        self._cache: dict[int, float | None] = {}  # bin -> profile value; cleared per new bin
        self._cache_upto = -1

    # ----- learning --------------------------------------------------------------------------
    def observe(self, t_s: float, rate_rps: float | None) -> None:
        """Record the mean rate seen over a short interval ending near t_s; None/NaN = missing."""
        if not _finite(rate_rps):
            return
        rate = max(float(rate_rps), 0.0)
        b = math.floor(t_s / self.cfg.bin_s)
        if self._first_bin is None or b < self._first_bin:
            self._first_bin = b
        p = self.profile_at(t_s, t_s)
        self._sum[b] = self._sum.get(b, 0.0) + rate
        self._num[b] = self._num.get(b, 0) + 1
        self._push((t_s, rate, p if p is not None and p > 0 else 0.0))
        self._trim(t_s)

    def _push(self, item: tuple[float, float, float]) -> None:
        self._recent.append(item)
        _, rate, p = item
        self._sums[0] += rate
        if p > 0:
            self._sums[1] += rate
            self._sums[2] += p

    def _trim(self, now_s: float) -> None:
        while self._recent and self._recent[0][0] < now_s - self.cfg.level_window_s:
            _, rate, p = self._recent.popleft()
            self._sums[0] -= rate
            if p > 0:
                self._sums[1] -= rate
                self._sums[2] -= p
        if not self._recent:  # reset float drift
            self._sums = [0.0, 0.0, 0.0]
        oldest = math.floor(now_s / self.cfg.bin_s) - self.cfg.max_history_days * self._bins_per_day
        if self._first_bin is not None and self._first_bin < oldest:
            for b in [b for b in self._sum if b < oldest]:
                del self._sum[b], self._num[b]
            self._first_bin = min(self._sum, default=None)

    def history_days(self, now_s: float) -> float:
        if self._first_bin is None:
            return 0.0
        return max(now_s - self._first_bin * self.cfg.bin_s, 0.0) / _DAY_S

    # ----- the profile -----------------------------------------------------------------------
    def _mean(self, b: int) -> float | None:
        n = self._num.get(b)
        return self._sum[b] / n if n else None

    def _seasonal(self, b: int, period_bins: int, count: int) -> float | None:
        """Mean over the last `count` periods of bins b-1, b, b+1 (missing ones skipped)."""
        vals = []
        for k in range(1, count + 1):
            centre = b - k * period_bins
            near = [self._mean(centre + d) for d in (-1, 0, 1)]
            v = self._mean(centre)
            if v is None:
                known = [x for x in near if x is not None]
                v = sum(known) / len(known) if known else None
            else:
                known = [x for x in near if x is not None]
                v = 0.5 * v + 0.5 * sum(known) / len(known)  # centre weighted 2x the neighbours
            if v is not None:
                vals.append(v)
        return sum(vals) / len(vals) if vals else None

    def _profile_bin(self, b: int, now_bin: int) -> float | None:
        if now_bin != self._cache_upto:  # a bin completed: the profile may have changed
            self._cache.clear()
            self._cache_upto = now_bin
        if b not in self._cache:
            daily = self._seasonal(b, self._bins_per_day, self.cfg.profile_days)
            value = daily
            if self._first_bin is not None and (
                now_bin - self._first_bin >= self.cfg.weekly_min_days * self._bins_per_day
            ):
                weekly = self._seasonal(b, 7 * self._bins_per_day, 2)
                if weekly is not None and daily is not None:
                    value = 0.5 * daily + 0.5 * weekly
            self._cache[b] = value
        return self._cache[b]

    def profile_at(self, t_s: float, now_s: float | None = None) -> float | None:
        """The seasonal profile at t_s, interpolated between bin centres; None when unknown."""
        now_bin = math.floor((t_s if now_s is None else now_s) / self.cfg.bin_s)
        x = t_s / self.cfg.bin_s - 0.5
        lo = math.floor(x)
        a, b = self._profile_bin(lo, now_bin), self._profile_bin(lo + 1, now_bin)
        if a is None or b is None:
            return a if b is None else b
        w = x - lo
        return (1 - w) * a + w * b

    # ----- the level -------------------------------------------------------------------------
    def level_rps(self) -> float | None:
        if not self._recent:
            return None
        return max(self._sums[0], 0.0) / len(self._recent)

    def mean_rps(self, now_s: float, window_s: float) -> float | None:
        """The mean of the rates observed over the last `window_s` (None: none observed; only
        the last level window is kept)."""
        pts = [r for t, r, _ in reversed(self._recent) if t > now_s - window_s]
        return sum(pts) / len(pts) if pts else None

    def trend_rps(self, now_s: float, window_s: float, ahead_s: float) -> float | None:
        """The least-squares line through the rates observed over the last `window_s`, read
        `ahead_s` past now when it rises (a ramp under way continues over the cold start) and at
        now when it falls; None with fewer than 3 observations in the window. Only the last
        level window is kept, so `window_s` past it sees no more."""
        pts = [(t, r) for t, r, _ in self._recent if t >= now_s - window_s]
        if len(pts) < 3:
            return None
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        mr = sum(r for _, r in pts) / n
        var = sum((t - mt) ** 2 for t, _ in pts)
        slope = sum((t - mt) * (r - mr) for t, r in pts) / var if var > 0 else 0.0
        at_s = now_s + (ahead_s if slope > 0 else 0.0)
        return max(mr + slope * (at_s - mt), 0.0)

    def _level_ratio(self) -> float:
        """Observed / profile over the level window. The profile of each observation is the one
        in force when it arrived (kept with it), so this costs O(1) per call."""
        obs, prof = self._sums[1], self._sums[2]
        if prof > 0:
            lo, hi = self.cfg.ratio_clip
            self._last_ratio = min(max(obs / prof, lo), hi)
        return self._last_ratio  # no recent profiled observations (a gap): keep the last level

    # ----- prediction ------------------------------------------------------------------------
    def predict(self, now_s: float, lead_s: float, horizon_s: float = 0.0) -> Forecast:
        check_range("Forecaster.predict", "lead_s", lead_s, 0.0)
        check_range("Forecaster.predict", "horizon_s", horizon_s, 0.0)
        self._trim(now_s)
        level = self.level_rps()
        ratio = self._level_ratio()
        end = now_s + lead_s + horizon_s
        step = self.cfg.bin_s / 2
        times = [now_s + i * step for i in range(int((end - now_s) // step) + 1)] + [end]
        profile = [self.profile_at(t, now_s) for t in times]
        if all(p is None for p in profile):
            last = level if level is not None else 0.0
            basis = "last value (no profile yet)" if level is not None else "no data"
            return Forecast(last, last, basis, level or 0.0)
        w, last = self.cfg.profile_weight, level if level is not None else 0.0
        if self.cfg.carry_window_s > 0:
            carried = self.mean_rps(now_s, self.cfg.carry_window_s)
            last = carried if carried is not None else last
        shape = self._shape(now_s, profile)
        filled = [
            w * p * ratio + (1 - w) * last * k if p is not None else last
            for p, k in zip(profile, shape, strict=True)
        ]
        at_lead = self.profile_at(now_s + lead_s, now_s)
        at_lead = w * at_lead * ratio + (1 - w) * last if at_lead is not None else last
        # not floored at the level window's mean: in a fall that mean is the past, and the
        # policy's base already holds the rate seen now
        peak = max(filled)
        weekly = self.history_days(now_s) >= self.cfg.weekly_min_days
        kind = "day-of-week+daily" if weekly else "daily"
        basis = f"{kind} profile x level {ratio:.2f}"
        return Forecast(at_lead, peak, basis, level or 0.0)

    def _shape(self, now_s: float, profile: list[float | None]) -> list[float]:
        """profile(t) / profile(now), clipped: the recent level carried along the day's shape.

        Blending with a flat last value would damp every ramp the profile knows is coming (R9:
        pre-warm before the noon peak); carrying the level along the shape keeps the ramp while the
        blend still decides how much to trust the profile's level.
        """
        p_now = self.profile_at(now_s, now_s)
        if p_now is None or p_now <= 0:
            return [1.0] * len(profile)
        lo, hi = self.cfg.ratio_clip
        return [min(max(p / p_now, lo), hi) if p is not None else 1.0 for p in profile]

    # ----- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        cfg = asdict(self.cfg)
        cfg["ratio_clip"] = list(self.cfg.ratio_clip)
        return {
            "config": cfg,
            "bins": [[b, self._sum[b], self._num[b]] for b in sorted(self._sum)],
            "recent": [list(x) for x in self._recent],
            "last_ratio": self._last_ratio,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Forecaster:
        cfg = dict(d["config"])
        for gone in ("burst_window_s", "burst_quantile"):  # histories saved before the headroom
            cfg.pop(gone, None)
        cfg["ratio_clip"] = tuple(cfg["ratio_clip"])
        f = cls(ForecastConfig(**cfg))
        for b, s, n in d["bins"]:
            f._sum[int(b)], f._num[int(b)] = float(s), int(n)
        f._first_bin = min(f._sum, default=None)
        for t, r, p in d["recent"]:
            f._push((float(t), float(r), float(p)))
        f._last_ratio = float(d["last_ratio"])
        return f
