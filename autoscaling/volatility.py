"""How volatile the traffic has been lately: the mean jump between consecutive 10-minute means.

    sigma = mean over the last `num_jumps` of |log(mean rate of window k / of window k-1)|

Volatility clusters: a jumpy hour tends to be followed by another (the lag-1 autocorrelation of
those jumps is 0.49 on m-small, 0.27 on m-large). The headroom learner (autoscaling/headroom.py)
uses sigma to put each forecast error in a volatility class, so a calm hour does not pay for the
surprises of a jumpy one and a jumpy hour is not planned with a calm hour's headroom.

`classes_of` puts sigmas in the classes, and `extrapolated` scales a headroom learned at lower
volatility to a higher one (HeadroomConfig.extrapolate_volatility_above).

Windows are `WINDOW_S` long and aligned to the clock; a window with no observation (a trace gap)
breaks the chain, so no jump is measured across a gap. Pure arithmetic, time passed in.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Any

import numpy as np

WINDOW_S = 600.0  # ServeGen's window, and long enough that Poisson noise in its mean is small


class VolatilityTracker:
    def __init__(self, num_jumps: int = 6) -> None:
        self.num_jumps = num_jumps
        self._window: int | None = None  # index of the window being filled
        self._sum, self._num = 0.0, 0
        self._means: deque[tuple[int, float]] = deque(maxlen=num_jumps + 1)  # (window, mean)

    def observe(self, t_s: float, rate_rps: float | None) -> None:
        """The mean rate of a short interval ending near t_s; None or NaN: nothing seen."""
        if rate_rps is None or not math.isfinite(rate_rps):
            return
        k = math.floor(t_s / WINDOW_S)
        if self._window is not None and k > self._window and self._num:
            self._means.append((self._window, self._sum / self._num))
            self._sum, self._num = 0.0, 0
        if self._window is None or k > self._window:
            self._window = k
        self._sum += max(float(rate_rps), 0.0)
        self._num += 1

    def sigma(self) -> float | None:
        """Mean |log jump| between consecutive complete windows; None before the first jump."""
        jumps = [
            abs(math.log(b / a))
            for (ka, a), (kb, b) in itertools.pairwise(self._means)
            if kb == ka + 1 and a > 0 and b > 0
        ]
        return sum(jumps) / len(jumps) if jumps else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_jumps": self.num_jumps,
            "window": self._window,
            "sum": self._sum,
            "num": self._num,
            "means": [list(x) for x in self._means],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, num_jumps: int) -> VolatilityTracker:
        tracker = cls(num_jumps)
        if not d:  # a history saved before volatility was tracked
            return tracker
        tracker._window = None if d["window"] is None else int(d["window"])
        tracker._sum, tracker._num = float(d["sum"]), int(d["num"])
        tracker._means.extend((int(k), float(m)) for k, m in d["means"])
        return tracker


def classes_of(sigmas: np.ndarray, thresholds: np.ndarray | None) -> np.ndarray:
    """The volatility class of each sigma between `thresholds` (ascending; a sigma equal to one is
    in the class below it, so flat traffic's zeros are one class); -1: no class (sigma not
    measured, or classes not learned yet)."""
    if thresholds is None:
        return np.full(len(sigmas), -1)
    classes = np.searchsorted(thresholds, sigmas, side="left")
    classes[~np.isfinite(sigmas)] = -1
    return classes


def class_of(sigma: float, thresholds: np.ndarray | None) -> int:
    """`classes_of` for one sigma."""
    return int(classes_of(np.array([sigma]), thresholds)[0])


def extrapolated(factor: float, sigma: float, sigma_ref: float) -> float:
    """A headroom learned on traffic mostly no jumpier than `sigma_ref`, for traffic at `sigma`:
    its log scaled by sigma / sigma_ref beyond it (a forecast's log-error over a lead of a few
    windows grows in proportion to the windows' jumps), unchanged within it. A headroom below 1
    (a forecast that over-predicts) is not scaled: jumpier traffic gives no reason to hold less."""
    if not (sigma > sigma_ref > 0) or factor <= 1.0:
        return factor
    return math.exp(math.log(factor) * sigma / sigma_ref)
