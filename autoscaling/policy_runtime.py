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
from autoscaling.history_store import (
    decision_record,
    default_history_path,
)
from autoscaling.memory import ScalerMemory
from autoscaling.policy import PolicyConfig
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
        self.refused = RateMeter()  # the same readings' refusals (429 for capacity)
        self.clock: ModelClock | None = None
        self.target: int | None = None  # the cold target this runtime last returned
        self.next_tick_s = float("-inf")
        self.saved_wall_s = float("-inf")
        self.started_wall_s: float | None = None
        self.mismatch_logged = False
        self.memory = ScalerMemory.load(self.history_path)

    def save(self, model_now_s: float, wall_s: float) -> None:
        self.memory.save(self.history_path, model_now_s)
        self.saved_wall_s = wall_s

    def step(self, view: PoolView, wall_s: float) -> int | None:
        """The cold pool's target now; None: leave Serve's target as it is."""
        if self.started_wall_s is None:
            self.started_wall_s = wall_s
        self.memory.tracker.observe_running(view.cold_running, wall_s)
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
            self.clock = self.memory.start_clock(self.cfg.controller, wall_s)
        self.next_tick_s = wall_s + self.cfg.controller.interval_s
        self._tick(view, wall_s)
        return self.target

    def _observed(
        self, view: PoolView, rate: float | None, refused: float | None, model_now_s: float
    ) -> step.Observed:
        assert self.clock is not None
        p95_wall = self.memory.tracker.p95_s()
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
            refused_rps=refused or 0.0,
            # the ingress's counts span its previous report to this one (wall time)
            rate_at_s=None if rate is None else self.clock.now(self.rate.mid_s),
        )

    def _tick(self, view: PoolView, wall_s: float) -> None:
        assert self.clock is not None
        model_now = self.clock.now(wall_s)
        rate = refused = None
        if view.ingress is not None and view.ingress_sample_s is not None:
            rate = self.rate.update(view.ingress.num_requests, view.ingress_sample_s)
            refused = self.refused.update(view.ingress.num_refused, view.ingress_sample_s)
        seen = self._observed(view, rate, refused, model_now)
        decision, forecast = self.memory.tick(self.policy_cfg, seen, model_now)
        target = decision.cold_target
        current = view.cold_target if self.target is None else self.target
        if target > current:
            self.memory.tracker.requested(target - current, wall_s)
        elif target < current:
            self.memory.tracker.cancelled(current - target)
        changed = target != self.target
        self.target = target
        record = decision_record(
            model_now, wall_s, decision, forecast, rate, view.hot_running, view.cold_running, view
        )
        record["policy"] = self.status_extra()
        self.memory.history.add_decision(record)
        if changed:
            log.info("cold -> %s: %s", target, decision.reason)
        if changed or wall_s - self.saved_wall_s >= SAVE_EVERY_S:
            self.save(model_now, wall_s)

    def status_extra(self) -> dict[str, Any]:
        """What a decision record says about this policy instance (shown by `status`)."""
        clock = self.clock
        return {
            "started_wall_s": self.started_wall_s,
            "restored_history": self.memory.restored,
            "time_scale": None if clock is None else clock.time_scale,
            "cold_start_p95_s": self.memory.tracker.p95_s(),
            "cold_start_samples_s": list(self.memory.tracker.samples_s),
            "pending_cold_starts": self.memory.tracker.num_pending,
        }
