"""Per-second rate curves from a trace's window means, for the replay (pure numpy).

A rate series (ServeGen) gives one mean per 10-minute window. Repeating each mean for its window
(`steps`) makes every rate change a step at a window edge, which no real service has and which a
policy could learn to exploit (headroom placed only at the grid's edges). `interpolated` draws a
continuous curve instead: piecewise linear through one knot per window centre, with the knots
solved so that **each window's mean is the trace's mean** (the replay keeps the trace's traffic,
only its shape inside each window changes). `shifted` moves the whole curve later by `phase_s`
seconds, so the trace's windows no longer line up with the controller's ticks or with the
forecaster's 10-minute bins.

Why the knots are solved and not just the means: a linear curve through the means at the centres
lowers every peak window's mean (its neighbours are lower) and raises every trough's. The window
mean of that curve is (v[k-1] + 6 v[k] + v[k+1]) / 8 (continuous time; the ends held flat), an
operator with eigenvalues in [0.5, 1], so v <- v + (m - A v) converges by at least half per
step. Knots are kept >= 0, and a last per-window rescale makes each mean exact on whole seconds.
"""

from __future__ import annotations

import numpy as np

ARRIVAL_SHAPES = ("steps", "interpolated")
_SOLVE_STEPS = 60  # halves the error at least each: far below a request per window


def window_means_of_linear(knots: np.ndarray) -> np.ndarray:
    """Each window's mean of the curve linear between window centres, flat past the ends."""
    left = np.r_[knots[0], knots[:-1]]
    right = np.r_[knots[1:], knots[-1]]
    return (left + 6.0 * knots + right) / 8.0


def solve_knots(means: np.ndarray) -> np.ndarray:
    """Knot values at the window centres whose linear curve has the given window means."""
    if np.isnan(means).any() or (means < 0).any():
        raise ValueError("means must be finite and >= 0 (fill the trace's gaps first)")
    v = means.astype(float).copy()
    for _ in range(_SOLVE_STEPS):
        v = np.maximum(v + (means - window_means_of_linear(v)), 0.0)
    return v


def interpolated(means: np.ndarray, bin_s: int) -> np.ndarray:
    """A per-second rate whose mean over each window of `bin_s` seconds is that window's mean."""
    if bin_s < 1 or len(means) == 0:
        raise ValueError(f"interpolated needs bin_s >= 1 (got {bin_s}) and at least one window")
    if bin_s == 1:
        return means.astype(float).copy()
    knots = solve_knots(means)
    centres = (np.arange(len(means)) + 0.5) * bin_s
    rate = np.interp(np.arange(len(means) * bin_s) + 0.5, centres, knots)
    # exact on whole seconds: the clipped knots and the discrete sum leave a small residue
    got = rate.reshape(len(means), bin_s).mean(axis=1)
    fix = np.divide(means, got, out=np.ones_like(got), where=got > 0)
    return (rate.reshape(len(means), bin_s) * fix[:, None]).ravel()


def steps(means: np.ndarray, bin_s: int) -> np.ndarray:
    """Each window's mean held for the whole window (the traces' own resolution)."""
    return np.repeat(means.astype(float), bin_s)


def shifted(per_second: np.ndarray, phase_s: int) -> np.ndarray:
    """The curve `phase_s` seconds later: the first `phase_s` seconds repeat the first value."""
    if phase_s < 0:
        raise ValueError(f"phase_s={phase_s} is out of range; allowed: >= 0")
    if phase_s == 0:
        return per_second.copy()
    return np.r_[np.full(phase_s, per_second[0]), per_second[:-phase_s]]


def rate_curve(means: np.ndarray, bin_s: int, shape: str, phase_s: int = 0) -> np.ndarray:
    """The per-second rate of a whole trace: `steps` or `interpolated`, then shifted."""
    if shape not in ARRIVAL_SHAPES:
        raise ValueError(f"arrival shape={shape!r} is not known; choose from {ARRIVAL_SHAPES}")
    curve = steps(means, bin_s) if shape == "steps" else interpolated(means, bin_s)
    return shifted(curve, phase_s)
