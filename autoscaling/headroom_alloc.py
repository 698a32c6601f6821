"""Spend the SLO's violation budget where headroom is dearest to hold (pure, numpy).

Per band b, a headroom h_b costs GPU-time in proportion to the band's traffic share w_b times
h_b, and lets through the traffic of the plans whose actual/forecast score exceeds h_b:
w_b x P_b(h_b). The goal is the least total headroom for a total exceedance of at most 1 - q:

    min  sum_b w_b h_b   subject to   sum_b w_b P_b(h_b) <= 1 - q.

Greedy on a grid of exceedance levels per band: every band starts covering all its scores; the
move that saves the most headroom per unit of budget spent (w_b cancels in that ratio) and still
fits is taken, until none fits. A band whose surprises are rare and huge gives its few up first;
one whose surprises are frequent and small keeps covering them. Identical bands end at the
same quantile.
"""

from __future__ import annotations

import math

import numpy as np

# exceedance levels a band may settle at (share of its traffic let through)
LEVELS = np.array(
    [0.0, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3]
)


def _curve(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Headroom per exceedance level: the least score with at most that share of traffic above."""
    order = np.argsort(scores)
    s, w = scores[order], weights[order]
    above = (w.sum() - np.cumsum(w)) / w.sum()  # traffic share strictly above s[k]
    first = np.searchsorted(-above, -LEVELS - 1e-12)  # first k with above[k] <= level
    return s[np.minimum(first, len(s) - 1)]


def allocate(bands: list[tuple[np.ndarray, np.ndarray]], quantile: float) -> list[float]:
    """Headroom per band: `bands` holds (scores, traffic weights) per band, each non-empty."""
    curves = [_curve(s, w) for s, w in bands]
    traffic = np.array([w.sum() for _, w in bands])
    share = traffic / traffic.sum()
    at = [0] * len(bands)  # each band's level index
    budget = 1.0 - quantile + 1e-12
    while True:
        best = None  # ((saving per budget, tie-breaks), band, level)
        for b, curve in enumerate(curves):
            j = at[b]
            for k in range(j + 1, len(LEVELS)):
                cost = share[b] * (LEVELS[k] - LEVELS[j])
                if cost > budget:
                    break
                ratio = (curve[j] - curve[k]) / (LEVELS[k] - LEVELS[j])
                # on a tie, the band that has spent the least moves, by the smallest step: equal
                # bands stay equal
                key = (round(ratio, 9), -LEVELS[j], -k)
                if ratio > 0 and (best is None or key > best[0]):
                    best = (key, b, k)
        if best is None:
            return [float(c[j]) for c, j in zip(curves, at, strict=True)]
        _, b, k = best
        budget -= share[b] * (LEVELS[k] - LEVELS[at[b]])
        at[b] = k


def pooled_towards(own: float, pooled: float, share: float) -> float:
    """A group's headroom moved `share` of the way to the pooled one, in log (both > 0): partial
    pooling, for when a group's own tail is a noisy or misleading estimate of its next week's."""
    return math.exp((1.0 - share) * math.log(own) + share * math.log(pooled))
