"""PolicyRuntime: the forecast-driven cold pool's memory and cadence, around the pure tick.

Serve's application-level policy (autoscaling/serve_policy.py) hands it a `PoolView` (what the
ingress and the replicas reported, and Serve's replica counts) and the wall time, on every
control-loop iteration (~0.1 s). Every `controller.interval_s` it runs one `step.tick` (the same
function the replay runs) and returns the cold pool's target; in between it returns the last
one and only watches cold starts (target raised -> replica running, to the control loop's
resolution). It reads no clock and calls no Ray API: time comes in, so tests step it by hand.

Its memory (forecast, learned headroom, cold-start samples, policy state, last decisions) is the
history file of autoscaling/history_store.py: loaded when Serve builds the policy (every deploy,
and when Serve's controller restarts) and written atomically on a change or every
`SAVE_EVERY_S`, so neither a redeploy nor a controller restart loses the forecast.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from autoscaling import step
from autoscaling.cold_start import ColdStartTracker
from autoscaling.forecast import Forecaster
from autoscaling.headroom import HeadroomLearner
from autoscaling.history_store import (
    History,
    decision_record,
    default_history_path,
    load_history,
    save_history,
)
from autoscaling.policy import PolicyConfig, PolicyState
from autoscaling.signals import ModelClock, RateMeter, lead_override_s
from serving.config import AppConfig
from serving.llm.autoscaling_stats import IngressStats

log = logging.getLogger("ray.serve")

SAVE_EVERY_S = 30.0  # wall seconds between history saves when nothing changed


@dataclass(frozen=True, slots=True)
class PoolView:
    """One control-loop iteration's view of the app (autoscaling/serve_policy.read_view)."""

    ingress: IngressStats | None  # None: no fresh report (ingress starting or restarting)
    ingress_sample_s: float | None  # wall time of that report (the rate's time axis)
    hot_running: int
    cold_running: int
    cold_target: int  # Serve's current target for cold
    queue_depth: int  # waiting sequences over hot and cold replicas with a fresh report
    queue_wait_s: float  # worst replica's p99 queue wait


class PolicyRuntime:
    def __init__(self, cfg: AppConfig, config_crc: int, history_path: str | None = None) -> None:
        self.cfg = cfg
        self.config_crc = config_crc
        self.policy_cfg = PolicyConfig.from_app_config(cfg)
        self.history_path = history_path or cfg.controller.history_path
        self.history_path = self.history_path or default_history_path(cfg.controller.app_name)
        self.rate = RateMeter()
        self.clock: ModelClock | None = None
        self.target: int | None = None  # the cold target this runtime last returned
        self.next_tick_s = float("-inf")
        self.saved_wall_s = float("-inf")
        self.started_wall_s: float | None = None
        self.mismatch_logged = False
        self._restore()

    def _restore(self) -> None:
        try:
            history = load_history(self.history_path)
        except ValueError as err:  # unreadable: start fresh, and say so
            log.warning("ignoring autoscaler history: %s", err)
            history = None
        self.restored = history is not None
        self.history = history or History()
        h = self.history
        self.forecaster = Forecaster.from_dict(h.forecaster) if h.forecaster else Forecaster()
        self.learner = HeadroomLearner.from_dict(h.headroom) if h.headroom else HeadroomLearner()
        self.tracker = ColdStartTracker(h.cold_start_samples_s)
        self.state = (
            PolicyState.from_dict(h.policy_state) if h.policy_state else PolicyState.initial()
        )

    def save(self, model_now_s: float, wall_s: float) -> None:
        self.history.forecaster = self.forecaster.to_dict()
        self.history.headroom = self.learner.to_dict()
        self.history.cold_start_samples_s = list(self.tracker.samples_s)
        self.history.policy_state = self.state.to_dict()
        self.history.saved_at_s = model_now_s
        save_history(self.history_path, self.history)
        self.saved_wall_s = wall_s

    def _anchor_clock(self, wall_s: float) -> ModelClock:
        """Model time starts when the app first serves; a restart resumes a compressed clock
        where the history left it (time_scale > 1 only plays a day in tests and demos)."""
        ctl = self.cfg.controller
        start = wall_s if ctl.clock_start_s is None else ctl.clock_start_s
        saved = self.history.saved_at_s
        if ctl.clock_start_s is not None and saved is not None and saved > start:
            start = saved
        return ModelClock(start_s=start, wall0_s=wall_s, time_scale=ctl.time_scale)

    def step(self, view: PoolView, wall_s: float) -> int | None:
        """The cold pool's target now; None: leave Serve's target as it is."""
        if self.started_wall_s is None:
            self.started_wall_s = wall_s
        self.tracker.observe_running(view.cold_running, wall_s)
        if view.ingress is not None and view.ingress.config_crc != self.config_crc:
            if not self.mismatch_logged:  # fail closed: never scale on another app's config
                log.error(
                    "autoscaling_policy.policy_kwargs.app_args is not the config the ingress "
                    "was built from (crc %s != %s): the cold pool is held at %s. Point "
                    "app_args at the application's args (a YAML alias: *args).",
                    self.config_crc,
                    view.ingress.config_crc,
                    view.cold_target,
                )
                self.mismatch_logged = True
            return None
        if wall_s < self.next_tick_s:
            return self.target
        if self.clock is None:
            if view.hot_running < 1:
                return None  # still deploying: the day starts when the app serves
            self.clock = self._anchor_clock(wall_s)
        self.next_tick_s = wall_s + self.cfg.controller.interval_s
        self._tick(view, wall_s)
        return self.target

    def _observed(self, view: PoolView, rate: float | None, model_now_s: float) -> step.Observed:
        assert self.clock is not None
        p95_wall = self.tracker.p95_s()
        return step.Observed(
            rate_rps=rate,
            hot_ready=view.hot_running,
            cold_ready=view.cold_running,
            cold_starting=max(0, view.cold_target - view.cold_running),
            queue_depth=view.queue_depth,
            queue_wait_s=view.queue_wait_s,
            cold_start_p95_s=None if p95_wall is None else self.clock.to_model_s(p95_wall),
            lead_override_s=lead_override_s(self.cfg.controller, model_now_s),
            offline_cold_replicas=0 if view.ingress is None else view.ingress.offline_cold_replicas,
        )

    def _tick(self, view: PoolView, wall_s: float) -> None:
        assert self.clock is not None
        model_now = self.clock.now(wall_s)
        rate = None
        if view.ingress is not None and view.ingress_sample_s is not None:
            rate = self.rate.update(view.ingress.num_requests, view.ingress_sample_s)
        seen = self._observed(view, rate, model_now)
        decision, self.state, forecast = step.tick(
            self.forecaster, self.learner, self.state, self.policy_cfg, seen, model_now
        )
        target = decision.cold_target
        current = view.cold_target if self.target is None else self.target
        if target > current:
            self.tracker.requested(target - current, wall_s)
        elif target < current:
            self.tracker.cancelled(current - target)
        changed = target != self.target
        self.target = target
        record = decision_record(
            model_now, wall_s, decision, forecast, rate, view.hot_running, view.cold_running, view
        )
        record["policy"] = self.status_extra()
        self.history.add_decision(record)
        if changed:
            log.info("cold -> %s: %s", target, decision.reason)
        if changed or wall_s - self.saved_wall_s >= SAVE_EVERY_S:
            self.save(model_now, wall_s)

    def status_extra(self) -> dict[str, Any]:
        """What a decision record says about this policy instance (shown by `status`)."""
        clock = self.clock
        return {
            "started_wall_s": self.started_wall_s,
            "restored_history": self.restored,
            "time_scale": None if clock is None else clock.time_scale,
            "cold_start_p95_s": self.tracker.p95_s(),
            "cold_start_samples_s": list(self.tracker.samples_s),
            "pending_cold_starts": self.tracker.num_pending,
        }
