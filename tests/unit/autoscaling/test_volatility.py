"""Recent volatility, and the headroom learned per volatility class (Mondrian conformal)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaling.headroom import HeadroomConfig, HeadroomLearner
from autoscaling.volatility import WINDOW_S, VolatilityTracker, class_of, extrapolated


def feed(tracker: VolatilityTracker, window_rates: list[float | None], t0: float = 0.0) -> None:
    """One observation in the middle of each 10-minute window (None: a gap)."""
    for i, rate in enumerate(window_rates):
        tracker.observe(t0 + (i + 0.5) * WINDOW_S, rate)


def test_no_volatility_before_two_complete_windows():
    v = VolatilityTracker()
    feed(v, [100.0, 150.0])  # the second window is still open
    assert v.sigma() is None
    v.observe(2.5 * WINDOW_S, 100.0)  # a third window opens: the second is complete
    assert v.sigma() == pytest.approx(math.log(1.5))


def test_flat_traffic_has_zero_volatility_and_jumps_count_both_ways():
    flat, jumpy = VolatilityTracker(), VolatilityTracker()
    feed(flat, [100.0] * 10)
    feed(jumpy, [100.0, 200.0, 100.0, 200.0, 100.0])
    assert flat.sigma() == 0.0
    assert jumpy.sigma() == pytest.approx(math.log(2.0))


def test_only_the_last_jumps_count():
    v = VolatilityTracker(num_jumps=2)
    feed(v, [100.0, 300.0, 100.0, 100.0, 100.0, 100.0])  # the jumps are older than 2 windows
    assert v.sigma() == 0.0


def test_no_jump_is_measured_across_a_gap():
    v = VolatilityTracker()
    feed(v, [100.0, None, 400.0, 400.0])
    assert v.sigma() is None  # 100 -> (gap) -> 400 is not a jump; 400 -> 400 is still open
    v.observe(4.5 * WINDOW_S, 400.0)
    assert v.sigma() == 0.0


def test_the_tracker_survives_a_round_trip_through_a_dict():
    v = VolatilityTracker(num_jumps=3)
    feed(v, [100.0, 150.0, 120.0, 130.0])
    back = VolatilityTracker.from_dict(v.to_dict(), 3)
    assert back.sigma() == v.sigma()
    assert VolatilityTracker.from_dict(None, 3).sigma() is None  # a history saved before


def test_classes_split_at_the_thresholds_and_unknown_volatility_has_none():
    import numpy as np

    thresholds = np.array([0.05, 0.15])
    assert [class_of(s, thresholds) for s in (0.0, 0.05, 0.1, 0.3)] == [0, 0, 1, 2]
    assert class_of(math.nan, thresholds) == -1
    assert class_of(0.1, None) == -1


def learner(classes: int = 2) -> HeadroomLearner:
    # each observation scored alone: these tests are about the classes, not the smoothing
    cfg = HeadroomConfig(
        quantile=0.95, min_scores=5, num_volatility_classes=classes, score_window_s=0.0
    )
    return HeadroomLearner(cfg)


def run_phase(h: HeadroomLearner, t: float, window_rates: list[float]) -> float:
    """Each 10 s a plan for the next 5 minutes, sized for the rate now (a last-value forecast),
    then the next 10 s seen. Plans late in a window see the next window's jump."""
    for rate in window_rates:
        for _ in range(int(WINDOW_S // 10)):
            h.observe(t, rate)
            h.expect(t, t + 300.0, rate)
            t += 10.0
    return t


def test_a_jumpy_hour_gets_the_jumpy_hours_headroom_and_a_calm_one_the_calm_ones():
    h = learner()
    t = run_phase(h, 0.0, [100.0] * 12)  # two calm hours: the last value is always right
    t = run_phase(h, t, [100.0, 160.0] * 6)  # two jumpy hours: 60% jumps at window edges
    t = run_phase(h, t, [100.0] * 7)  # calm again for an hour and more
    calm = h.headroom(t)
    assert calm.factor == pytest.approx(1.0) and "volatility class 1 of 2" in calm.basis
    t = run_phase(h, t, [100.0, 160.0] * 2)  # volatility is back up
    jumpy = h.headroom(t + 600.0)
    assert jumpy.factor == pytest.approx(1.6) and "volatility class 2 of 2" in jumpy.basis


def test_one_class_is_the_plain_quantile_over_all_scores():
    h = learner(classes=1)
    run_phase(h, 0.0, [100.0] * 12 + [100.0, 160.0] * 6)
    head = h.headroom(5 * 3600.0)
    assert "all scores" in head.basis and "volatility" not in head.basis


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [("num_volatility_classes", 0, "1 <= "), ("volatility_num_jumps", 200, "<= 144")],
)
def test_bad_volatility_settings_name_the_field_and_the_range(field, value, allowed):
    with pytest.raises(ValueError, match=field) as err:
        HeadroomConfig(**{field: value})
    assert allowed in str(err.value)


def test_a_history_saved_before_volatility_loads_and_learns_on():
    h = learner()
    run_phase(h, 0.0, [100.0] * 3)
    old = h.to_dict()
    del old["volatility"]
    old["bands"] = [[x[:3] for x in band] for band in old["bands"]]
    old["pending"] = [x[:4] for x in old["pending"]]
    back = HeadroomLearner.from_dict(old)
    assert back.num_scores() == h.num_scores() and back.volatility.sigma() is None
    run_phase(back, 3 * WINDOW_S, [100.0] * 3)
    assert back.headroom(6 * WINDOW_S).factor == pytest.approx(1.0)


def test_past_the_windows_volatility_the_log_headroom_scales_with_the_jumps():
    # learned at jumps of log 1.2, now jumps twice as large: the log-headroom doubles
    assert extrapolated(1.2, 2 * math.log(1.2), math.log(1.2)) == pytest.approx(1.44)
    assert extrapolated(1.2, math.log(1.2), math.log(1.2)) == 1.2  # within the range: as learned
    assert extrapolated(0.9, 1.0, 0.1) == 0.9  # a forecast that over-predicts is left alone
    assert extrapolated(1.2, 0.3, 0.0) == 1.2  # flat traffic only: no scale to extrapolate from
    assert extrapolated(1.2, math.nan, 0.1) == 1.2


def test_traffic_jumpier_than_most_scored_plans_gets_more_headroom_only_when_asked():
    def fed(above: float) -> tuple[HeadroomLearner, float]:
        cfg = HeadroomConfig(quantile=0.95, min_scores=5, num_volatility_classes=2)
        h = HeadroomLearner(replace(cfg, score_window_s=0.0, extrapolate_volatility_above=above))
        t = run_phase(h, 0.0, [100.0] * 12)
        return h, run_phase(h, t, [100.0, 120.0] * 6)  # jumps of 20% at window edges

    (on, t), (off, _) = fed(0.9), fed(0.0)  # the 90th percentile of the plans' sigma: log 1.2
    assert on.headroom(t).factor == off.headroom(t).factor == pytest.approx(1.2)
    run_phase(on, t, [60.0, 120.0])  # a halving: past 90% of the plans scored so far
    run_phase(off, t, [60.0, 120.0])
    t += 2 * WINDOW_S
    sigma = on.volatility.sigma()  # the jumps of 20%, 20% and 100%
    assert sigma == pytest.approx((2 * math.log(1.2) + math.log(2.0)) / 3)
    assert off.headroom(t).factor == pytest.approx(1.2)  # the top class as learned
    jumpy = on.headroom(t)
    assert jumpy.factor == pytest.approx(1.2 ** (sigma / math.log(1.2)))  # about 1.42
    assert "past the window's 0.182" in jumpy.basis


def test_the_extrapolations_quantile_out_of_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"extrapolate_volatility_above=1\.5") as err:
        HeadroomConfig(extrapolate_volatility_above=1.5)
    assert "<= 1" in str(err.value)


def test_a_reference_lag_keeps_the_calmer_past_as_the_reference_for_that_long():
    def fed(lag_s: float) -> tuple[HeadroomLearner, float]:
        cfg = HeadroomConfig(quantile=0.95, min_scores=5, num_volatility_classes=2)
        cfg = replace(cfg, score_window_s=0.0, extrapolate_volatility_above=0.9)
        h = HeadroomLearner(replace(cfg, extrapolate_reference_lag_s=lag_s))
        t = run_phase(h, 0.0, [100.0] * 12 + [100.0, 120.0] * 6)  # calm, then jumps of 20%
        return h, run_phase(h, t, [60.0, 120.0] * 6)  # two hours of halvings and doublings

    (now, t), (lagged, _) = fed(0.0), fed(2 * 3600.0)
    # two hours in, a third of the plans scored are the new regime's: the reference is in it
    assert "past the window's" not in now.headroom(t).basis
    # the plans scored before the last two hours are the calm and the 20% ones
    late = lagged.headroom(t)
    assert "past the window's 0.182" in late.basis and late.factor > now.headroom(t).factor


def calm_and_jumpy(**kw) -> tuple[float, float, float]:
    """The calm and the jumpy class's headroom after the phases above, and the pooled one."""
    out = []
    for classes in (2, 1):
        cfg = HeadroomConfig(
            quantile=0.95, min_scores=5, num_volatility_classes=classes, score_window_s=0.0, **kw
        )
        h = HeadroomLearner(cfg)
        t = run_phase(h, 0.0, [100.0] * 12 + [100.0, 160.0] * 6 + [100.0] * 7)
        out.append(h.headroom(t).factor)
        t = run_phase(h, t, [100.0, 160.0] * 2)
        out.append(h.headroom(t + 600.0).factor)
    calm, jumpy, pooled, _ = out
    return calm, jumpy, pooled


def test_class_pooling_moves_each_class_towards_the_pooled_headroom_in_log():
    calm, jumpy, pooled = calm_and_jumpy()
    # the jumps are more than 5% of all scores: pooled, the calm hours would hold them too
    assert (calm, jumpy, pooled) == (pytest.approx(1.0), pytest.approx(1.6), pytest.approx(1.6))
    half_calm, half_jumpy, _ = calm_and_jumpy(class_pooling=0.5)
    assert half_calm == pytest.approx(math.sqrt(calm * pooled))  # halfway, in log
    assert half_jumpy == pytest.approx(math.sqrt(jumpy * pooled))
    all_calm, all_jumpy, _ = calm_and_jumpy(class_pooling=1.0)
    assert all_calm == pytest.approx(pooled) and all_jumpy == pytest.approx(pooled)


def test_class_pooling_out_of_range_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"class_pooling=1.5 is out of range"):
        HeadroomConfig(class_pooling=1.5)
