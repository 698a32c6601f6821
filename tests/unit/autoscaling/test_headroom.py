"""Headroom learned online: an upper quantile of actual / forecast, spent per time-of-day band."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaling.headroom import HeadroomConfig, HeadroomLearner, band_of
from autoscaling.headroom_alloc import allocate

HOUR = 3600.0


def learner(**kw) -> HeadroomLearner:
    # time-of-day bands alone (the volatility classes have tests of their own below)
    values = dict(quantile=0.9, num_bands=4, min_scores=10, num_volatility_classes=1)
    values["score_window_s"] = 0.0  # each observation alone (the smoothing is tested below)
    values.update(kw)
    return HeadroomLearner(HeadroomConfig(**values))


def plan_and_see(h: HeadroomLearner, t: float, forecast: float, actual: float) -> None:
    """A plan at t for the 10 s from t, then the rate seen over those 10 s."""
    h.expect(t, t + 10.0, forecast)
    h.observe(t + 10.0, actual)


def test_bands_split_the_day_evenly():
    assert [band_of(h * HOUR, 4) for h in (0, 5.9, 6, 12, 23.99, 24)] == [0, 0, 1, 2, 3, 0]


def test_nothing_is_learned_before_min_scores():
    h = learner()
    for i in range(9):
        plan_and_see(h, i * 20.0, 100.0, 120.0)
    head = h.headroom(0.0)
    assert head.factor is None and "not learned" in head.basis


def test_a_forecast_that_is_20_percent_low_gets_1_2_headroom():
    h = learner()
    for i in range(50):
        plan_and_see(h, i * 20.0, 100.0, 120.0)
    head = h.headroom(0.0)
    assert head.factor == pytest.approx(1.2)
    assert "band 0 of 4" in head.basis and head.num_scores == 50


def test_bigger_surprises_get_more_headroom_with_the_same_settings():
    calm, bursty = learner(), learner()
    for i in range(100):
        plan_and_see(calm, i * 20.0, 100.0, 100.0 + (i % 10))  # up to 9% over
        plan_and_see(bursty, i * 20.0, 100.0, 100.0 + 5 * (i % 10))  # up to 45% over
    # q 0.9: the top tenth of the scores goes through
    assert calm.headroom(0.0).factor == pytest.approx(1.08)
    assert bursty.headroom(0.0).factor == pytest.approx(1.40)


def test_each_band_learns_its_own_errors():
    h = learner()
    for i in range(50):
        plan_and_see(h, i * 20.0, 100.0, 100.0)  # night: the forecast is right
        plan_and_see(h, 12 * HOUR + i * 20.0, 100.0, 150.0)  # afternoon: 50% surprises
    assert h.headroom(1 * HOUR).factor == pytest.approx(1.0)
    assert h.headroom(13 * HOUR).factor == pytest.approx(1.5)


def test_a_band_without_enough_scores_borrows_all_bands():
    h = learner()
    for i in range(20):
        plan_and_see(h, i * 20.0, 100.0, 130.0)
    head = h.headroom(7 * HOUR)  # band 1 has none
    assert head.factor == pytest.approx(1.3) and "pooled" in head.basis


def test_a_plan_is_scored_by_the_highest_rate_over_its_span():
    h = learner(min_scores=1, quantile=0.6)
    h.expect(100.0, 130.0, 100.0)
    for t, rate in ((110.0, 90.0), (120.0, 140.0), (130.0, 100.0)):
        h.observe(t, rate)
    assert h.num_scores() == 1
    assert h.headroom(100.0).factor == pytest.approx(1.4)


def test_a_burst_shorter_than_the_score_window_counts_at_its_mean_over_the_window():
    # 10 s at 160 rps among 100s: over 30 s it is a mean of 120, which the queue absorbs
    h = learner(min_scores=1, quantile=0.6, score_window_s=30.0)
    h.observe(100.0, 100.0)
    h.expect(100.0, 140.0, 100.0)
    for t, rate in ((110.0, 100.0), (120.0, 160.0), (130.0, 100.0), (140.0, 100.0)):
        h.observe(t, rate)
    assert h.headroom(100.0).factor == pytest.approx(1.2)
    # the same burst, each observation alone: scored at its 160
    raw = learner(min_scores=1, quantile=0.6, score_window_s=0.0)
    raw.expect(100.0, 140.0, 100.0)
    for t, rate in ((110.0, 100.0), (120.0, 160.0), (130.0, 100.0), (140.0, 100.0)):
        raw.observe(t, rate)
    assert raw.headroom(100.0).factor == pytest.approx(1.6)


def test_a_step_that_lasts_is_scored_in_full_once_it_fills_the_score_window():
    h = learner(min_scores=1, quantile=0.6, score_window_s=30.0)
    h.expect(100.0, 160.0, 100.0)
    for t, rate in ((110.0, 100.0), (120.0, 150.0), (130.0, 150.0), (140.0, 150.0)):
        h.observe(t, rate)
    h.observe(160.0, 150.0)
    assert h.headroom(100.0).factor == pytest.approx(1.5)


def test_a_gap_empties_the_score_window():
    h = learner(min_scores=1, quantile=0.6, score_window_s=60.0)
    h.observe(90.0, 1000.0)  # before the gap: must not count after it
    h.observe(100.0, None)
    h.expect(105.0, 120.0, 100.0)
    h.observe(110.0, 100.0)
    h.observe(120.0, 110.0)
    assert h.headroom(100.0).factor == pytest.approx(1.05)  # mean of 100 and 110


def test_the_score_window_survives_a_restart():
    h = learner(min_scores=1, quantile=0.6, score_window_s=30.0)
    h.observe(100.0, 200.0)
    back = HeadroomLearner.from_dict(h.to_dict())
    back.expect(105.0, 110.0, 100.0)
    back.observe(110.0, 100.0)
    assert back.headroom(100.0).factor == pytest.approx(1.5)  # mean of 200 and 100


def test_a_score_window_out_of_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match="score_window_s"):
        HeadroomConfig(score_window_s=-1.0)


def test_plans_over_a_gap_are_not_scored():
    h = learner(min_scores=1)
    h.expect(100.0, 120.0, 100.0)
    h.observe(110.0, None)  # no data for part of the span
    h.observe(120.0, 500.0)
    assert h.num_scores() == 0


def test_old_scores_leave_after_the_window():
    h = learner(window_s=HOUR)
    for i in range(50):
        plan_and_see(h, i * 20.0, 100.0, 200.0)  # an hour of 2x surprises, then calm
    for i in range(50):
        plan_and_see(h, 2 * HOUR + i * 20.0, 100.0, 100.0)
    assert h.headroom(2 * HOUR + 1200.0).factor == pytest.approx(1.0)


def test_headroom_is_clipped():
    h = learner(clip=(0.5, 2.0))
    for i in range(50):
        plan_and_see(h, i * 20.0, 100.0, 1000.0)
    assert h.headroom(0.0).factor == 2.0


def test_a_lower_bound_above_one_is_a_floor_under_calm_traffic():
    h = learner(clip=(1.1, 4.0))
    for i in range(50):
        plan_and_see(h, i * 20.0, 100.0, 100.0)  # the forecast is exact: learned headroom 1
    assert h.headroom(0.0).factor == pytest.approx(1.1)


def test_state_survives_a_round_trip_through_a_dict():
    h = learner()
    for i in range(30):
        plan_and_see(h, i * 20.0, 100.0, 110.0 + i)
    h.expect(5000.0, 5010.0, 100.0)  # still pending
    back = HeadroomLearner.from_dict(h.to_dict())
    assert back.headroom(0.0) == h.headroom(0.0)
    back.observe(5010.0, 300.0)
    assert back.num_scores() == 31


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("quantile", 0.4, "0.5 < quantile <= 1.0"),
        ("num_bands", 7, "divide a day"),
        ("min_scores", 0, "1 <= min_scores"),
        ("clip[1]", 0.9, "1.0 <= clip[1]"),
        ("clip[0]", 2.5, "0.0 < clip[0] <= 2.0"),
    ],
)
def test_bad_settings_name_the_field_and_the_range(field, value, allowed):
    clips = {"clip[1]": (0.5, value), "clip[0]": (value, 2.0)}
    kw = {"clip": clips[field]} if field in clips else {field: value}
    with pytest.raises(ValueError, match=re_escape(allowed)):
        HeadroomConfig(**kw)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_nan_forecasts_are_ignored():
    h = learner(min_scores=1)
    h.expect(0.0, 10.0, math.nan)
    h.expect(0.0, 10.0, 0.0)
    h.observe(10.0, 100.0)
    assert h.num_scores() == 0


def band(scores: list[float], weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    return np.array(scores), np.full(len(scores), weight)


def test_identical_bands_get_the_same_quantile():
    scores = [1.0 + i / 100 for i in range(100)]  # 1.00 .. 1.99
    hs = allocate([band(scores), band(scores)], quantile=0.9)
    assert hs[0] == hs[1] and hs[0] == pytest.approx(1.89)  # 1.90 .. 1.99 above: 10%


def test_the_budget_goes_to_the_band_whose_surprises_are_rare_and_huge():
    rare_huge = band([1.0] * 98 + [3.0] * 2)  # 2% of plans see 3x the forecast
    frequent_small = band([1.0] * 90 + [1.0 + i / 100 for i in range(1, 11)])  # up to 10% over
    h_rare, h_small = allocate([rare_huge, frequent_small], quantile=0.98)
    # a per-band 98% quantile would hold 3x all day in the first band; here its 2% go through
    # (1% of all traffic) and the second band covers all but its top 2% (the other 1%)
    assert h_rare == 1.0
    assert h_small == pytest.approx(1.08)


def test_exceedance_is_counted_in_traffic_not_in_plans():
    busy = band([1.0] * 95 + [1.5] * 5, weight=9.0)
    quiet = band([1.0] * 95 + [1.5] * 5, weight=1.0)
    h_busy, h_quiet = allocate([busy, quiet], quantile=0.99)
    # letting the quiet band's 5% through costs 0.5% of traffic, the busy band's 4.5%
    assert (h_busy, h_quiet) == (1.5, 1.0)
