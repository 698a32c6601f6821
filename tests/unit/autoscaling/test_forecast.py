"""Forecaster: a daily profile scaled by the recent level, blind to gaps, restorable."""

from __future__ import annotations

import json
import math

import pytest

from autoscaling.forecast import Forecast, ForecastConfig, Forecaster

DAY = 86400.0


def daily(t_s: float, base: float = 100.0) -> float:
    """A day with a trough at 06:00 (base/2) and a peak at 18:00 (1.5 x base)."""
    return base * (1.0 - 0.5 * math.cos(2 * math.pi * (t_s % DAY - 6 * 3600) / DAY))


SHAPE_ONLY = ForecastConfig(profile_weight=1.0)  # trust the profile's shape fully


def fed(days: float, rate=daily, step_s: float = 600.0, cfg=SHAPE_ONLY) -> Forecaster:
    f = Forecaster(cfg)
    t = step_s / 2
    while t < days * DAY:
        f.observe(t, rate(t))
        t += step_s
    return f


def test_without_history_it_predicts_the_last_observed_level():
    f = Forecaster()
    assert f.predict(0.0, 600.0).basis == "no data"
    for i in range(3):
        f.observe(10.0 * i, 50.0)
    fc = f.predict(30.0, 1200.0, 60.0)
    assert fc.rate_at_lead_rps == pytest.approx(50.0)
    assert fc.peak_rps == pytest.approx(50.0)
    assert "last value" in fc.basis


def test_after_a_day_it_anticipates_the_daily_ramp():
    f = fed(3.0)
    now = 3 * DAY + 12 * 3600  # noon, rate rising to the 18:00 peak
    fc = f.predict(now, lead_s=3 * 3600.0)
    assert fc.rate_at_lead_rps == pytest.approx(daily(now + 3 * 3600), rel=0.05)
    assert fc.rate_at_lead_rps > 1.2 * daily(now)
    assert "daily profile" in fc.basis


def test_by_default_the_profile_shape_is_blended_with_the_last_level():
    now = 3 * DAY + 12 * 3600
    shaped = fed(3.0).predict(now, 3 * 3600.0)
    blended = fed(3.0, cfg=ForecastConfig(profile_weight=0.7)).predict(now, 3 * 3600.0)
    expected = 0.7 * shaped.rate_at_lead_rps + 0.3 * shaped.level_rps
    assert blended.rate_at_lead_rps == pytest.approx(expected)


def test_peak_is_the_max_over_lead_plus_horizon_and_not_below_the_level():
    f = fed(3.0)
    now = 3 * DAY + 14 * 3600
    short = f.predict(now, 600.0, 0.0)
    long = f.predict(now, 600.0, 4 * 3600.0)  # reaches past the 18:00 peak
    assert long.peak_rps == pytest.approx(150.0, rel=0.05)
    assert short.peak_rps < long.peak_rps
    assert long.peak_rps >= long.level_rps


def test_a_busier_day_scales_the_profile_by_the_recent_level():
    f = fed(3.0)
    t = 3 * DAY
    while t < 3 * DAY + 10 * 3600:  # today runs at twice the usual rate
        f.observe(t, 2 * daily(t))
        t += 60.0
    fc = f.predict(t, 3600.0)
    assert fc.rate_at_lead_rps == pytest.approx(2 * daily(t + 3600), rel=0.1)
    assert "level 2.0" in fc.basis


def test_missing_windows_are_not_learned_as_zero_traffic():
    gap = (DAY + 10 * 3600, DAY + 14 * 3600)  # day 2, 10:00-14:00 missing (None and NaN)
    f = Forecaster()
    t = 300.0
    while t < 3 * DAY:
        missing = gap[0] <= t < gap[1]
        f.observe(t, (None if t % 1200 < 600 else math.nan) if missing else daily(t))
        t += 600.0
    noon = 3 * DAY + 12 * 3600
    assert f.profile_at(noon, noon) == pytest.approx(daily(noon), rel=0.03)
    # and a gap right now keeps the last level instead of dropping to zero
    for i in range(6):
        f.observe(noon + 600 * i, None)
    assert f.predict(noon + 3600, 600.0).rate_at_lead_rps > 0.5 * daily(noon)


def test_day_of_week_profile_is_blended_in_after_14_days():
    def weekly(t_s: float) -> float:  # Sundays (day 6 of each week) at half the rate
        return daily(t_s) * (0.5 if int(t_s // DAY) % 7 == 6 else 1.0)

    f = fed(20.0, weekly)
    sunday_noon = 20 * DAY + 12 * 3600  # day 20 is a Sunday
    assert "day-of-week" in f.predict(sunday_noon, 600.0).basis
    # the profile remembers Sundays are quiet even though yesterday was busy
    assert f.profile_at(sunday_noon, sunday_noon) < 0.85 * daily(sunday_noon)
    assert "day-of-week" not in fed(5.0).predict(5 * DAY, 600.0).basis


def test_to_dict_round_trips_through_json_and_predicts_the_same():
    f = fed(2.5, step_s=300.0)
    g = Forecaster.from_dict(json.loads(json.dumps(f.to_dict())))
    now = 2.5 * DAY
    a, b = g.predict(now, 900.0, 60.0), f.predict(now, 900.0, 60.0)
    assert a.basis == b.basis
    for name in ("rate_at_lead_rps", "peak_rps", "level_rps"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9)


def test_history_older_than_max_history_days_is_dropped():
    f = Forecaster(ForecastConfig(max_history_days=2))
    for i in range(5 * 144):
        f.observe(600.0 * i + 300, 10.0)
    assert f.history_days(5 * DAY) <= 2.01
    assert len(f.to_dict()["bins"]) <= 2 * 144 + 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"bin_s": 7.0}, "ForecastConfig.bin_s=7.0 must divide a day"),
        ({"profile_days": 0}, "ForecastConfig.profile_days=0 is out of range"),
        ({"ratio_clip": (0.0, 2.0)}, "ForecastConfig.ratio_clip[0]=0.0 is out of range"),
        ({"profile_weight": 1.5}, "ForecastConfig.profile_weight=1.5 is out of range"),
    ],
)
def test_config_errors_name_field_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ForecastConfig(**kwargs)


def test_forecast_is_frozen():
    fc = Forecast(1.0, 2.0, "x")
    with pytest.raises(AttributeError):
        fc.peak_rps = 3.0  # type: ignore[misc]


def test_the_recent_trend_extends_a_rising_line_over_the_lead_and_holds_a_falling_one():
    rising, falling = Forecaster(), Forecaster()
    for i in range(30):  # a tick every 10 s for 5 minutes
        rising.observe(10.0 * i, 100.0 + 0.5 * i)  # +0.05 rps per second
        falling.observe(10.0 * i, 100.0 - 0.5 * i)
    now = 290.0
    # the line through the last 180 s is at 114.5 rps now; 180 s ahead, +9 rps
    assert rising.trend_rps(now, 180.0, 180.0) == pytest.approx(123.5)
    assert falling.trend_rps(now, 180.0, 180.0) == pytest.approx(85.5)  # now, not ahead
    assert Forecaster().trend_rps(now, 180.0, 180.0) is None  # nothing observed
    few = Forecaster()
    few.observe(0.0, 1.0)
    few.observe(10.0, 2.0)
    assert few.trend_rps(10.0, 180.0, 180.0) is None  # two points make no trend


def test_in_a_fall_the_forecast_carries_the_last_minute_not_the_level_windows_mean():
    # Two flat days at 100 rps, then on day 3 the rate halves for the last two minutes: the
    # level window's 20-minute mean still says about 95. The shape-carried share follows the
    # last minute's 50 rps, so the forecast falls with the rate (the policy's base still holds
    # the rate seen now); carry_window_s 0 keeps the level window's mean.
    def run(cfg: ForecastConfig) -> Forecast:
        f = fed(2.0, rate=lambda t: 100.0, cfg=cfg)
        t0 = 2 * DAY + 3600.0
        for i in range(120):
            t = t0 + 10.0 * i
            f.observe(t, 100.0 if i < 108 else 50.0)
        return f.predict(t0 + 1190.0, 180.0, 60.0)

    carried, level_mean = run(ForecastConfig()), run(ForecastConfig(carry_window_s=0.0))
    assert carried.level_rps == pytest.approx(95.0)
    assert level_mean.peak_rps == pytest.approx(95.0, rel=0.02)
    assert carried.peak_rps < 0.9 * carried.level_rps


def test_carry_window_is_range_checked():
    with pytest.raises(ValueError, match=r"ForecastConfig.carry_window_s=2000.0 is out of range"):
        ForecastConfig(carry_window_s=2000.0)
