"""PolicyRuntime: the forecast-driven cold pool's memory and cadence, around the pure tick.

Serve's application-level policy (autoscaling/serve_policy.py) hands it a `PoolView` (what the
ingress and the replicas reported, and Serve's replica counts) and the wall time, on every
control-loop iteration (~0.1 s). Every `controller.interval_s` it runs one
`live_tick.live_tick` (the external-scaler actor runs the same one; it wraps `step.tick`, which
the replay runs) and returns the cold pool's target; in between it returns the last
one and only watches cold starts (target raised -> replica running, to the control loop's
resolution). It reads no clock and calls no Ray API: time comes in, so tests step it by hand.

Its memory (forecast, learned headroom, cold-start samples, policy state, last decisions) is the
history file of autoscaling/history_store.py: loaded when Serve builds the policy (every deploy,
and when Serve's controller restarts) and written atomically on a change or every
`SAVE_EVERY_S`, so neither a redeploy nor a controller restart loses the forecast.
"""

from __future__ import annotations

import logging
from typing import Any

from autoscaling.history_store import default_history_path
from autoscaling.live_tick import LiveMeters, PoolView, live_tick, note_cold_target
from autoscaling.memory import ScalerMemory
from autoscaling.policy import PolicyConfig
from autoscaling.signals import ModelClock
from serving.config import AppConfig

log = logging.getLogger("ray.serve")

SAVE_EVERY_S = 30.0  # wall seconds between history saves when nothing changed


class PolicyRuntime:
    def __init__(self, cfg: AppConfig, config_crc: int, history_path: str | None = None) -> None:
        self.cfg = cfg
        self.config_crc = config_crc
        self.policy_cfg = PolicyConfig.from_app_config(cfg)
        self.history_path = history_path or cfg.controller.history_path
        self.history_path = self.history_path or default_history_path(cfg.controller.app_name)
        self.meters = LiveMeters()  # the ingress's request and refusal (429) rates
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

    def _tick(self, view: PoolView, wall_s: float) -> None:
        assert self.clock is not None
        ctl = self.cfg.controller
        out = live_tick(self.memory, self.meters, self.clock, ctl, self.policy_cfg, view, wall_s)
        target = out.decision.cold_target
        current = view.cold_target if self.target is None else self.target
        note_cold_target(self.memory.tracker, current, target, wall_s)
        changed = target != self.target
        self.target = target
        out.record["policy"] = self.status_extra()
        self.memory.history.add_decision(out.record)
        if changed:
            log.info("cold -> %s: %s", target, out.decision.reason)
        if changed or wall_s - self.saved_wall_s >= SAVE_EVERY_S:
            self.save(out.model_now_s, wall_s)

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
