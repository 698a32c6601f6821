"""ForecastController: the detached, named Ray actor scaling the cold pool ahead of the forecast.

The only place in autoscaling/ that reads the clock, talks to Serve or sleeps. Every
`controller.interval_s` real seconds one tick:

    counts  <- Serve's replica states                   (serve_io.read_counts)
    rate    <- ingress cumulative request and 429 counts (signals.RateMeter)
    queue   <- the replicas' pushed stats                (signals.ReportBook, via report())
    cold-start samples <- running count vs our requests  (cold_start.ColdStartTracker)
    decision = live_tick.live_tick(...)  (the same tick as Serve's policy: observe, forecast,
                                          decide, the batch lane's ask included)
             -> serve_io.ServeScaler.scale(...)
    history  -> controller.history_path (atomic JSON)

Between ticks, while a scale-up is pending, the running count is polled every 0.5 s so a cold
start is measured to about half a second. Times inside the policy and forecaster are model
seconds (signals.ModelClock; time_scale = 1 in production). The loop runs in a daemon thread so
`report()` and `status()` answer while a tick waits on Serve.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import ray

from autoscaling.history_store import default_history_path
from autoscaling.live_tick import LiveMeters, PoolView, live_tick, note_cold_target
from autoscaling.memory import ScalerMemory
from autoscaling.policy import PolicyConfig
from autoscaling.reporter import CONTROLLER_NAMESPACE, controller_name
from autoscaling.serve_io import (
    ServeScaler,
    announce_target,
    dashboard_url,
    ingress_stats,
    read_counts,
)
from autoscaling.signals import ModelClock, ReportBook
from serving.config import AppConfig
from serving.llm.messages import ReplicaReport

log = logging.getLogger("ray.serve")

PENDING_POLL_S = 0.5
SAVE_EVERY_S = 30.0  # real seconds between history saves when nothing changed
APP_GONE_EXIT_S = 60.0  # stop when the scaled app has been deleted this long
# Replicas push every 2 s (Serve's routing-stats period in serving/app.py); a report older than
# this is from a replica that is gone or stuck.
REPORT_MAX_AGE_S = 10.0
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource
ANNOUNCE_GRACE_S = 1.0  # between telling the ingress a pool empties and emptying it


class ForecastController:
    def __init__(self, app_config: dict[str, Any]) -> None:
        self.cfg = AppConfig.from_args(app_config)
        ctl = self.cfg.controller
        self.app = ctl.app_name
        self.policy_cfg = PolicyConfig.from_app_config(self.cfg)
        self.clock: ModelClock | None = None  # set once the app serves (ScalerMemory.start_clock)
        self.history_path = ctl.history_path or default_history_path(self.app)
        self.lock = threading.Lock()
        self.book = ReportBook()
        self.meters = LiveMeters()  # the ingress's request and refusal (429) rates
        self.memory = ScalerMemory.load(self.history_path)
        self.scaler = ServeScaler(self.app, dashboard_url)
        self.applied: dict[str, int] = {}  # deployment -> target we set (or found at start)
        self.last: dict[str, Any] = {"state": "starting"}
        self.started_wall_s = time.time()  # tells a restarted instance from the one before
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._app_missing_since: float | None = None
        self._thread = threading.Thread(target=self._loop, name="forecast-controller", daemon=True)
        self._thread.start()

    # ----- persistence -----------------------------------------------------------------------
    def _save(self, model_now: float) -> None:
        self.memory.save(self.history_path, model_now)
        self._saved_wall = time.time()

    # ----- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        next_tick = time.time()
        self._saved_wall = 0.0
        while not self._stop.is_set():
            wall = time.time()
            try:
                if wall >= next_tick:
                    next_tick = wall + self.cfg.controller.interval_s
                    self._tick(wall)
                elif self.memory.tracker.num_pending:
                    self._poll_cold_starts(wall)
            except Exception as err:  # keep scaling next tick; the error shows in status()
                log.exception("controller tick failed")
                with self.lock:
                    self.errors = [*self.errors[-4:], f"{type(err).__name__}: {err}"[:300]]
            pause = next_tick - time.time()
            if self.memory.tracker.num_pending:
                pause = min(pause, PENDING_POLL_S)
            self._stop.wait(max(pause, 0.05))

    def _poll_cold_starts(self, wall: float) -> dict | None:
        counts = read_counts(self.app)
        if counts is None or "cold" not in counts:
            return counts
        with self.lock:  # status() reads the samples from the actor's thread
            done = self.memory.tracker.observe_running(counts["cold"].running, wall)
        for sample in done:
            log.info("cold replica ready %.1f s after it was requested", sample)
        return counts

    def _tick(self, wall: float) -> None:
        counts = self._poll_cold_starts(wall)
        if counts is None or not {"hot", "cold"} <= set(counts):
            self._app_missing(wall)
            return
        self._app_missing_since = None
        if self.clock is None:
            if counts["hot"].running < 1:
                return  # still deploying
            self.clock = self.memory.start_clock(self.cfg.controller, wall)
        for dep in ("hot", "cold"):
            self.applied.setdefault(dep, counts[dep].live)
        with self.lock:
            signals = self.book.signals(wall, REPORT_MAX_AGE_S)
        view = PoolView(
            ingress=ingress_stats(self.app),
            ingress_sample_s=wall,
            hot_running=counts["hot"].running,
            cold_running=counts["cold"].running,
            cold_target=counts["cold"].live,
            queue_depth=signals.queue_depth,
            queue_wait_s=signals.queue_wait_s,
            adapter_miss_s_per_request=signals.adapter_miss_s_per_request,
        )
        ctl = self.cfg.controller
        out = live_tick(self.memory, self.meters, self.clock, ctl, self.policy_cfg, view, wall)
        changed = self._apply("hot", out.decision.hot_target, counts["hot"].live, wall)
        changed |= self._apply("cold", out.decision.cold_target, counts["cold"].live, wall)
        with self.lock:
            self.memory.history.add_decision(out.record)
            self.last = {"state": "running", **out.record}
        if changed or time.time() - self._saved_wall >= SAVE_EVERY_S:
            self._save(out.model_now_s)

    def _apply(self, deployment: str, target: int, live: int, wall: float) -> bool:
        """Set the target when it changed, or again when Serve's live count drifted from it
        (a redeploy of the app resets its replica counts to the config's)."""
        current = self.applied[deployment]
        if target == current and live == target:
            return False
        if announce_target(self.app, deployment, target) and target == 0:
            time.sleep(ANNOUNCE_GRACE_S)  # requests dispatched just before reach a replica
        self.scaler.scale(deployment, target)
        self.applied[deployment] = target
        if deployment == "cold":
            with self.lock:
                note_cold_target(self.memory.tracker, current, target, wall)
        log.info(
            "%s %s -> %s replicas (%s live) via %s",
            deployment,
            current,
            target,
            live,
            self.scaler.path_used,
        )
        return True

    def _app_missing(self, wall: float) -> None:
        with self.lock:
            self.last = {"state": f"application {self.app!r} not found"}
        if not self.applied:  # not deployed yet (build_app starts us before serve.run)
            return
        if self._app_missing_since is None:
            self._app_missing_since = wall
        elif wall - self._app_missing_since > max(
            APP_GONE_EXIT_S, 6 * self.cfg.controller.interval_s
        ):
            log.warning("application %s gone; controller stops", self.app)
            self._stop.set()
            # From this thread exit_actor() cannot end the actor; a kill without restart can.
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    # ----- actor methods ----------------------------------------------------------------------
    def report(self, report: ReplicaReport) -> None:
        """A replica's queue numbers (autoscaling/reporter.py), pushed every ~2 s."""
        with self.lock:
            self.book.record(report, time.time())

    def status(self) -> dict[str, Any]:
        with self.lock:
            p95 = self.memory.tracker.p95_s()
            clock = self.clock
            return {
                "app": self.app,
                "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "started_wall_s": self.started_wall_s,
                "clock": None
                if clock is None
                else {
                    "start_s": clock.start_s,
                    "wall0_s": clock.wall0_s,
                    "time_scale": clock.time_scale,
                },
                "model_now_s": None if clock is None else clock.now(time.time()),
                "applied_targets": dict(self.applied),
                "apply_path": self.scaler.path_used,
                "cold_start_p95_s": p95,
                "cold_start_samples_s": list(self.memory.tracker.samples_s),
                "pending_cold_starts": self.memory.tracker.num_pending,
                "history_path": self.history_path,
                "restored_history": self.memory.restored,
                "last": dict(self.last),
                "recent_reasons": [d["reason"] for d in self.memory.history.decisions[-5:]],
                "recent_decisions": list(self.memory.history.decisions[-20:]),
                "errors": list(self.errors),
            }

    def stop(self) -> None:
        """Stop ticking (saves the history first); the actor stays until killed."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self.clock is not None:
            self._save(self.clock.now(time.time()))


RemoteController = ray.remote(num_cpus=0, max_restarts=-1)(ForecastController)


def ensure_controller(app_cfg: AppConfig):
    """Start the app's controller if it is not running; return its handle (None: Ray is down)."""
    if not ray.is_initialized():
        log.warning("Ray is not initialised; the forecast controller was not started")
        return None
    return RemoteController.options(
        name=controller_name(app_cfg.controller.app_name),
        namespace=CONTROLLER_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        # On the head node: it never sits on a cold node the autoscaler releases, and a restart
        # finds its history file where it left it.
        resources={HEAD_NODE_RESOURCE: 0.001},
    ).remote(app_cfg.to_dict())


def get_controller(app_name: str):
    """The running controller of an app; ValueError when there is none."""
    return ray.get_actor(controller_name(app_name), namespace=CONTROLLER_NAMESPACE)
