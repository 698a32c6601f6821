"""Rate curves from window means (autoscaling/replay/arrivals.py): interpolated curves keep every
window's mean, have no step at the window edges, and a phase shift moves them later."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.replay.arrivals import (
    interpolated,
    rate_curve,
    shifted,
    solve_knots,
    steps,
    window_means_of_linear,
)


def test_interpolated_keeps_every_windows_mean():
    means = np.array([100.0, 180.0, 90.0, 90.0, 300.0, 120.0])
    curve = interpolated(means, 600)
    assert curve.shape == (3600,)
    assert curve.reshape(6, 600).mean(axis=1) == pytest.approx(means, rel=1e-12)


def test_interpolated_has_no_step_at_a_window_edge():
    means = np.array([100.0, 200.0, 100.0])
    jumps = np.abs(np.diff(interpolated(means, 600)))
    assert jumps.max() < 1.0  # per second, where the held means jump by 100 at once
    assert np.abs(np.diff(steps(means, 600))).max() == 100.0


def test_the_knots_solve_the_window_means_of_the_linear_curve():
    means = np.array([10.0, 50.0, 20.0, 80.0])
    knots = solve_knots(means)
    assert window_means_of_linear(knots) == pytest.approx(means, rel=1e-9)
    # a peak window's knot stands above its mean, so the curve's mean there is the trace's
    assert knots[3] > means[3] and knots[1] > means[1]


def test_a_deep_trough_is_clipped_at_zero_and_its_mean_still_kept():
    means = np.array([100.0, 1.0, 100.0])
    curve = interpolated(means, 600)
    assert curve.min() >= 0.0
    assert curve.reshape(3, 600).mean(axis=1) == pytest.approx(means, rel=1e-9)


def test_a_phase_shift_moves_the_curve_later():
    curve = np.arange(10.0)
    assert shifted(curve, 3).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert shifted(curve, 0).tolist() == curve.tolist()
    with pytest.raises(ValueError, match="phase_s=-1"):
        shifted(curve, -1)


def test_rate_curve_names_an_unknown_shape_and_bad_means():
    with pytest.raises(ValueError, match="arrival shape='smooth'"):
        rate_curve(np.ones(3), 600, "smooth")
    with pytest.raises(ValueError, match="finite"):
        interpolated(np.array([1.0, np.nan]), 600)
    assert rate_curve(np.array([1.0, 2.0]), 2, "steps", 1).tolist() == [1.0, 1.0, 1.0, 2.0]
