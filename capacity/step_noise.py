"""Step-time jitter: the tail that the linear cost model cannot see.

The fit step_s = a + b*tokens + c*KV predicts the *typical* step of a given shape. Real steps of
one shape scatter around it (allocator, cache misses, other processes, Python's GC), and a p99
is made of that scatter. Calibration measures it where the shape is constant: the decode steps of
one grid cell (same batch, context growing by one token a step), each divided by the cell's
median. A profile keeps every (cell median, ratio) pair.

The scatter is not one multiplicative law: a millisecond of jitter is half of a 2 ms step and a
twentieth of a 20 ms one. So a step whose typical time is t draws its ratio R from the cells whose
median is near t (within a factor, widened until there are enough samples), and takes t x R.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_STEPS_PER_CELL = 4  # fewer decode steps say nothing about a cell's median
NEAR_FACTOR = 2.0  # cells whose median is within t / 2 .. 2t describe the jitter of a t step
MIN_NEAR_SAMPLES = 32  # widen the window until the tail has at least this many samples

NoiseSample = tuple[float, float]  # (cell median step_s, step_s / cell median)


def cell_noise(step_s: Sequence[float]) -> list[NoiseSample]:
    """(median, ratio) for each step of one shape; [] if too few steps to tell."""
    if len(step_s) < MIN_STEPS_PER_CELL:
        return []
    arr = np.asarray(step_s, dtype=np.float64)
    med = float(np.median(arr))
    return [] if med <= 0 else [(med, float(x / med)) for x in arr]


def ratios_near(samples: Sequence[NoiseSample], typical_s: float) -> np.ndarray:
    """Sorted ratios of the cells whose median is near typical_s ([1.0] without samples)."""
    if not samples:
        return np.ones(1)
    med = np.array([m for m, _ in samples])
    ratio = np.array([r for _, r in samples])
    dist = np.abs(np.log(med / typical_s))
    factor = NEAR_FACTOR
    while True:
        near = dist <= np.log(factor)
        if near.sum() >= min(MIN_NEAR_SAMPLES, len(samples)):
            return np.sort(ratio[near])
        factor *= 1.5


def mixture_quantile(
    typical_s: Sequence[float],
    weights: Sequence[float],
    samples: Sequence[NoiseSample],
    q: float,
) -> float:
    """q-quantile of step times when a step of kind j (share weights[j]) takes typical_s[j] x R.

    Solves sum_j w_j F_j(x / t_j) = q by bisection, F_j the empirical CDF of the ratios near t_j.
    Without samples R = 1: the q-quantile of the typical times themselves.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"mixture_quantile: q={q} must be in (0, 1)")
    t = np.asarray(typical_s, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if t.shape != w.shape or t.size == 0 or np.any(w < 0) or w.sum() <= 0 or np.any(t <= 0):
        raise ValueError(f"mixture_quantile: bad typical_s={typical_s!r} / weights={weights!r}")
    w = w / w.sum()
    tables = [ratios_near(samples, tj) for tj in t]

    def cdf(x: float) -> float:
        return sum(
            wj * np.searchsorted(r, x / tj, side="right") / r.size
            for wj, tj, r in zip(w, t, tables, strict=True)
        )

    lo = min(tj * r[0] for tj, r in zip(t, tables, strict=True)) * 0.999
    hi = max(tj * r[-1] for tj, r in zip(t, tables, strict=True)) * 1.001
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return hi
