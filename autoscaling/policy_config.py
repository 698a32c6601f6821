"""PolicyConfig: the validated, frozen settings of the hot/cold policy (autoscaling/policy.py).

Its cluster.yaml face is the `controller` section plus `pools` and the interactive tier's TTFT SLO;
`PolicyConfig.from_app_config(app_cfg)` maps them. Errors name the field, the value and the range.

What each default was fit on is in autoscaling/fit_on.py. The defaults cluster.yaml's
`controller` section also exposes live in common/policy_defaults.py, so the replay and a live app
read them from one place.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from common import policy_defaults as defaults
from common.validate import check_order, check_range

# the plan's protections that are spans of time: each can shrink with a shorter cold start
TIME_PROTECTIONS = (
    "cold_start_margin_s",
    "horizon_s",
    "stabilization_window_s",
    "trend_window_s",
    "panic_drain_s",
)
# ... and those that do by default: not the trend's window. It is the span the rate's line is
# fit over, a filter of the counts' noise rather than a wait for a start; shrunk with the start,
# its slope grew noisy and its floor dearer (a diagnostic after the fifteenth tuning run, on
# the `smooth` shape's first split: 0.926x of the oracle's GPU-hours to 99.5% against 0.903x)
SCALED_WITH_COLD_START = tuple(n for n in TIME_PROTECTIONS if n != "trend_window_s")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    _owner = "PolicyConfig"

    replica_capacity_rps: float  # requests/s one replica sustains within the TTFT SLO
    hot_replicas: int = 1  # always on (R5); the policy never changes it
    min_cold_replicas: int = 0
    max_cold_replicas: int = 2
    ttft_slo_s: float = 1.0
    # plan replicas at this share of capacity (R6: 0.7-0.85)
    target_utilization: float = defaults.TARGET_UTILIZATION
    # lead when no cold start was measured and no window override applies
    lead_s: float = defaults.LEAD_S
    cold_start_margin_s: float = defaults.COLD_START_MARGIN_S  # added to the measured p95
    # also cover the forecast this long past the lead. The plan is remade every tick and the
    # scale-down window holds it, so a longer span mostly widens the max its scores are taken
    # over; 30 s chosen in the twelfth tuning run (fit_on.FIT_ON), against 60 s and 0
    horizon_s: float = 30.0
    # > 0: the plan's base is also at least the observed rates' least-squares line over this
    # window, extended over the lead when it rises (forecast.Forecaster.trend_rps); 0: off.
    # Chosen on the validation splits (benchmarks/results/autoscaling_validation_trend.json)
    trend_window_s: float = 180.0
    # scale-down = max recommendation over this window; short, because the learned headroom
    # already covers the forecast's errors over the cold start (a long hold pays twice)
    stabilization_window_s: float = defaults.STABILIZATION_WINDOW_S
    panic_queue_fraction: float = 0.5  # emergency when queue wait/depth > this x ttft_slo_s
    # ... or when more than this share of the interval's requests were refused for capacity
    # (429): the replicas' admission keeps their queues short by refusing, so under overload
    # the refusals, not the queue, say that requests miss the SLO
    panic_refused_share: float = 0.02
    panic_drain_s: float = 30.0  # an emergency sizes the pool to drain the queue this fast
    panic_hold_s: float = 60.0  # no scale-down this long after an emergency (Knative: 60 s)
    # the plan's queue margin (policy.queue_margin_rps): capacity above the base so that its
    # Poisson arrivals pass the emergency's queue wait this share of the time; 0: no margin
    queue_tail_share: float = defaults.QUEUE_TAIL_SHARE
    # the scale-down band (policy._scale_down_band): a replica goes only if the pool left behind
    # passes that wait at most this share of the time; 0: no band (down to the plan at once);
    # at or above queue_tail_share it keeps nothing the plan does not
    # Chosen on the validation splits (autoscaling_validation_frontier_scale_down_band.json),
    # refit with the plan at 0.5 in the tenth run (autoscaling_validation_frontier_tenth_run.json)
    scale_down_tail_share: float = defaults.SCALE_DOWN_TAIL_SHARE
    # the plan's "rate seen now" is the mean over this window (0: the last tick's rate alone;
    # a 10 s count's noise, taken as a max with the forecast, biased every plan upwards)
    rate_window_s: float = 30.0
    # > 0: the plan's time protections (the lead's margin, the horizon, the scale-down window
    # and the emergency's drain: scaled_with_cold_start) were fit at a cold start this long, and
    # a measured p95 start shorter than it shrinks them in proportion (never grows them): a
    # replica that starts in 20 s is a cheaper mistake to undo than one that takes 120 s.
    # 0: fixed, whatever the start. See for_cold_start
    protections_fit_at_cold_start_s: float = defaults.PROTECTIONS_FIT_AT_COLD_START_S
    # which of TIME_PROTECTIONS shrink (the trend's window not, by default: see its comment)
    scaled_with_cold_start: tuple[str, ...] = SCALED_WITH_COLD_START

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "replica_capacity_rps", self.replica_capacity_rps, 0.0, 1e9, lo_open=True)
        check_range(o, "hot_replicas", self.hot_replicas, 1, None, integer=True)
        check_range(o, "min_cold_replicas", self.min_cold_replicas, 0, None, integer=True)
        check_range(o, "max_cold_replicas", self.max_cold_replicas, 0, None, integer=True)
        check_order(
            o,
            ("min_cold_replicas", self.min_cold_replicas),
            ("max_cold_replicas", self.max_cold_replicas),
        )
        check_range(o, "target_utilization", self.target_utilization, 0.0, 1.0, lo_open=True)
        check_range(o, "panic_queue_fraction", self.panic_queue_fraction, 0.0, 1.0, lo_open=True)
        check_range(o, "panic_refused_share", self.panic_refused_share, 0.0, 1.0)
        for name in ("ttft_slo_s", "panic_drain_s"):
            check_range(o, name, getattr(self, name), 0.0, 86400.0, lo_open=True)
        for name in (
            "lead_s",
            "cold_start_margin_s",
            "horizon_s",
            "stabilization_window_s",
            "trend_window_s",
            "rate_window_s",
            "protections_fit_at_cold_start_s",
        ):
            check_range(o, name, getattr(self, name), 0.0, 7 * 86400.0)
        check_range(o, "panic_hold_s", self.panic_hold_s, 0.0, 86400.0)
        scaled = self.scaled_with_cold_start
        if not isinstance(scaled, tuple) or not set(scaled) <= set(TIME_PROTECTIONS):
            raise ValueError(
                f"{o}.scaled_with_cold_start={scaled!r} must be a tuple of names from "
                f"{TIME_PROTECTIONS}"
            )
        check_range(o, "queue_tail_share", self.queue_tail_share, 0.0, 0.5)
        check_range(o, "scale_down_tail_share", self.scale_down_tail_share, 0.0, 0.5)
        for name in ("replica_capacity_rps", "ttft_slo_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{o}.{name}={getattr(self, name)!r} must be finite")

    def for_cold_start(self, cold_start_p95_s: float | None) -> PolicyConfig:
        """The settings a tick runs with when replicas start in `cold_start_p95_s` (p95): the
        protections named in scaled_with_cold_start times p95 / protections_fit_at_cold_start_s
        where that is below 1, else these settings unchanged (also with scaling off or no start
        measured yet)."""
        fit_s = self.protections_fit_at_cold_start_s
        if fit_s <= 0.0 or cold_start_p95_s is None or cold_start_p95_s >= fit_s:
            return self
        return _scaled(self, max(float(cold_start_p95_s), 0.0) / fit_s)

    @classmethod
    def from_app_config(cls, app_cfg: Any, **overrides: Any) -> PolicyConfig:
        """From a serving.config.AppConfig: pools, controller and the interactive TTFT SLO."""
        ctl = app_cfg.controller
        values: dict[str, Any] = dict(
            replica_capacity_rps=ctl.replica_capacity_rps,
            target_utilization=ctl.target_utilization,
            hot_replicas=app_cfg.pools.hot.num_replicas,
            min_cold_replicas=app_cfg.pools.cold.min_replicas,
            max_cold_replicas=app_cfg.pools.cold.max_replicas,
            ttft_slo_s=app_cfg.tiers["interactive"].ttft_p99_s,
            lead_s=ctl.forecast_lead_s,
            cold_start_margin_s=ctl.cold_start_margin_s,
            stabilization_window_s=ctl.stabilization_window_s,
            queue_tail_share=ctl.queue_tail_share,
            scale_down_tail_share=ctl.scale_down_tail_share,
            protections_fit_at_cold_start_s=ctl.protections_fit_at_cold_start_s,
        )
        values.update(overrides)
        return cls(**values)


@functools.lru_cache(maxsize=64)
def _scaled(cfg: PolicyConfig, factor: float) -> PolicyConfig:
    # cached: the replay asks every tick with the same p95, and replace() re-validates.
    # panic_drain_s must stay above 0 (it divides the backlog): a floor of one second
    values = {name: getattr(cfg, name) * factor for name in cfg.scaled_with_cold_start}
    if "panic_drain_s" in values:
        values["panic_drain_s"] = max(values["panic_drain_s"], 1.0)
    return replace(cfg, **values)
