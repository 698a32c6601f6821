"""HeadroomConfig: the validated, frozen settings of the learned headroom (autoscaling/headroom.py).

Errors name the field, the value and the range. What each default was fit on:
autoscaling/fit_on.FIT_ON.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.validate import check_bool, check_range

_DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class HeadroomConfig:
    _owner = "HeadroomConfig"

    # share of planned-for spans the capacity should cover: the SLO's own target share (99.5%)
    quantile: float = 0.995
    # time-of-day bands (1: none); volatility classes explain the errors better (module doc)
    num_bands: int = 1
    num_volatility_classes: int = 3  # classes of recent volatility (1: not grouped by it)
    volatility_num_jumps: int = 3  # the last 3 jumps of 10-minute means: half an hour
    window_s: float = 7 * _DAY_S  # scores older than this drop out (a week: every weekday)
    min_scores: int = 50  # per group before the group's own quantile is used
    # the headroom's bounds: below 1 when the forecast over-predicts; a lower bound above 1 is
    # a floor, a uniform margin like Knative's under the learned one (tried in the fourteenth
    # tuning run, docs/autoscaling.md)
    clip: tuple[float, float] = (0.5, 4.0)
    # the SLO's feedback on that headroom (autoscaling/headroom_feedback.py): log-headroom moved
    # per second of mean traffic, up when served in distress, down otherwise; 0 turns it off
    feedback_gain_per_s: float = 1e-4
    feedback_range: tuple[float, float] = (0.6, 2.0)  # bounds on the feedback's factor
    # plans are scored by the mean rate over this window, not by each tick's count: a burst
    # shorter than this mostly waits in the queue within the SLO (0: each observation alone)
    score_window_s: float = 30.0
    # replay training days (autoscaling/step.train) also score one plan per 10-minute window: a
    # coarser forecast than the live tick's, which sees the current rate and trend, so its errors
    # fill the headroom's tail. Off: the training days teach the forecaster and the volatility
    # classes only, and the headroom learns from live plans, as the live controller does
    score_training_windows: bool = False
    # > 0: past this quantile of the volatility of the window's scored plans (1: their largest;
    # traffic jumpier than the plans the headroom was learned on, as after a change of regime),
    # scale the group's log-headroom by sigma / that sigma, as forecast errors grow with the
    # jumps (`extrapolated`); 0: off, the top class's headroom as learned on calmer traffic
    # until the new regime's scores fill its tail. 0.99 chosen in the eleventh tuning run
    # (fit_on.FIT_ON): scaled only past what 1% of the week's plans saw
    extrapolate_volatility_above: float = 0.99
    # that quantile over the plans scored before now - this lag only (0: every plan scored): a
    # lag keeps the reference on the calmer past for a while after a change of regime
    extrapolate_reference_lag_s: float = 0.0
    # shrink each group's log-headroom this far towards the pooled one (0: each group's own, as
    # allocated; 1: every group at the pooled headroom). A group's tail is a week's estimate and
    # the classes split hours by the last half hour's jumps, which can mislead (before a step that
    # keeps to the clock the half hour is calm): partial pooling spreads the slack more evenly
    class_pooling: float = 0.0

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "quantile", self.quantile, 0.5, 1.0, lo_open=True)
        check_range(o, "num_bands", self.num_bands, 1, 96, integer=True)
        if _DAY_S % self.num_bands:
            raise ValueError(f"{o}.num_bands={self.num_bands!r} must divide a day evenly")
        check_range(o, "window_s", self.window_s, 60.0, 56 * _DAY_S)
        check_range(o, "num_volatility_classes", self.num_volatility_classes, 1, 10, integer=True)
        check_range(o, "volatility_num_jumps", self.volatility_num_jumps, 1, 144, integer=True)
        check_range(o, "min_scores", self.min_scores, 1, None, integer=True)
        lo, hi = self.clip
        check_range(o, "clip[1]", hi, 1.0, 100.0)
        check_range(o, "clip[0]", lo, 0.0, hi, lo_open=True)
        check_range(o, "feedback_gain_per_s", self.feedback_gain_per_s, 0.0, 1.0)
        lo, hi = self.feedback_range
        check_range(o, "feedback_range[0]", lo, 0.0, 1.0, lo_open=True)
        check_range(o, "feedback_range[1]", hi, 1.0, 100.0)
        check_range(o, "score_window_s", self.score_window_s, 0.0, 3600.0)
        check_bool(o, "score_training_windows", self.score_training_windows)
        check_range(o, "extrapolate_volatility_above", self.extrapolate_volatility_above, 0.0, 1.0)
        check_range(
            o, "extrapolate_reference_lag_s", self.extrapolate_reference_lag_s, 0.0, 7 * _DAY_S
        )
        check_range(o, "class_pooling", self.class_pooling, 0.0, 1.0)
