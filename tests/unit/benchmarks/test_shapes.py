"""The synthetic shapes the validation splits are made of (benchmarks/autoscaling_shapes.py)."""

from __future__ import annotations

import numpy as np

from benchmarks.autoscaling_shapes import NUM_WINDOWS, shapes

WINDOWS_PER_DAY = 144


def _jump_p98_by_day(series: np.ndarray) -> np.ndarray:
    """The 98th percentile of each day's |log jump| between consecutive 10-minute windows."""
    jumps = np.abs(np.diff(np.log(series)))
    days = np.arange(len(jumps)) // WINDOWS_PER_DAY
    return np.array([np.percentile(jumps[days == d], 98) for d in range(days.max() + 1)])


def test_every_shape_is_two_weeks_of_positive_rates():
    for name, series in shapes().items():
        assert series.shape == (NUM_WINDOWS,), name
        assert np.all(series > 0), name


def test_turning_volatile_turns_jumpier_after_the_training_week_and_again_after_day_10():
    p98 = _jump_p98_by_day(shapes()["turning_volatile"])
    training, early, late = p98[:7].max(), p98[7:10].min(), p98[10:].min()
    # the regime change the validation set lacked: every judged day jumps more than any day
    # learned on, and the second rolling origin (train 1-10) meets a jumpier regime still
    assert early > 1.5 * training
    assert late > early


# each earlier shape's sum over its two weeks, as the code before turning_volatile drew it
EARLIER_SUMS = {
    "weak_daily_ar": 200696.815333,
    "hourly_steps_weekly": 183493.420371,
    "smooth": 201521.333058,
    "volatile_afternoons": 202134.110483,
}


def test_adding_a_shape_left_the_earlier_four_as_they_were():
    # turning_volatile draws from its own generator, so the first four keep the series that
    # the earlier validation result files were replayed on
    series = shapes()
    assert list(series)[:4] == list(EARLIER_SUMS)
    for name, total in EARLIER_SUMS.items():
        assert round(float(series[name].sum()), 6) == total, name
