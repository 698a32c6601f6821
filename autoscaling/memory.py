"""The live scaler's memory across restarts, one shape for both scalers (Serve's policy in
autoscaling/policy_runtime.py, the external-scaler actor in autoscaling/controller.py).

`ScalerMemory.load` rebuilds the forecaster, the headroom learner, the cold-start samples and the
policy state from the history file (autoscaling/history_store.py); an unreadable file starts
fresh and says so. `anchor_clock` is where model time starts, so a restart resumes a compressed
clock where the history left it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from autoscaling import step
from autoscaling.cold_start import ColdStartTracker
from autoscaling.forecast import Forecast, Forecaster
from autoscaling.headroom import HeadroomLearner
from autoscaling.history_store import History, load_history, save_history
from autoscaling.policy import Decision, PolicyConfig, PolicyState
from autoscaling.signals import ModelClock

log = logging.getLogger("ray.serve")


@dataclass(slots=True)
class ScalerMemory:
    history: History
    forecaster: Forecaster
    learner: HeadroomLearner
    tracker: ColdStartTracker
    state: PolicyState
    restored: bool  # False: no history file (or an unreadable one) was found

    @classmethod
    def load(cls, path: str) -> ScalerMemory:
        try:
            history = load_history(path)
        except ValueError as err:  # unreadable: start fresh, and say so
            log.warning("ignoring autoscaler history: %s", err)
            history = None
        h = history or History()
        return cls(
            history=h,
            forecaster=Forecaster.from_dict(h.forecaster) if h.forecaster else Forecaster(),
            learner=HeadroomLearner.from_dict(h.headroom) if h.headroom else HeadroomLearner(),
            tracker=ColdStartTracker(h.cold_start_samples_s),
            state=PolicyState.from_dict(h.policy_state)
            if h.policy_state
            else PolicyState.initial(),
            restored=history is not None,
        )

    def start_clock(self, ctl, wall_s: float) -> ModelClock:
        """Both scalers' first tick once the app serves: model time starts (`anchor_clock`,
        resuming a compressed clock from the last save), and a restored policy state older
        than one stabilisation window is dropped (`forget_stale_state`). `ctl` is the app's
        `controller` config section."""
        clock = anchor_clock(ctl.clock_start_s, ctl.time_scale, self.history.saved_at_s, wall_s)
        self.forget_stale_state(clock.now(wall_s), ctl.stabilization_window_s)
        return clock

    def forget_stale_state(self, model_now_s: float, window_s: float) -> bool:
        """Drop the restored policy state (held cold target, stabilisation window, panic hold)
        when the history was saved more than one stabilisation window ago: that state only
        says what the last window saw, and an app started after a pause would otherwise hold
        the last run's cold replicas for another window with no evidence that it needs them.
        A controller restarted mid-run (saved moments ago) keeps it. True when dropped."""
        saved = self.history.saved_at_s
        if saved is None or model_now_s - saved <= window_s or self.state == PolicyState():
            return False
        log.info(
            "autoscaler state saved %.0f s ago (> the %.0f s stabilisation window): the cold "
            "pool starts from the forecast, not from the last run's target %s",
            model_now_s - saved,
            window_s,
            self.state.cold_target,
        )
        self.state = PolicyState.initial()
        return True

    def tick(
        self, cfg: PolicyConfig, seen: step.Observed, model_now_s: float
    ) -> tuple[Decision, Forecast]:
        """One `step.tick` on this memory: the forecaster and learner learn, the state advances."""
        decision, self.state, forecast = step.tick(
            self.forecaster, self.learner, self.state, cfg, seen, model_now_s
        )
        return decision, forecast

    def save(self, path: str, model_now_s: float) -> None:
        h = self.history
        h.forecaster = self.forecaster.to_dict()
        h.headroom = self.learner.to_dict()
        h.cold_start_samples_s = list(self.tracker.samples_s)
        h.policy_state = self.state.to_dict()
        h.saved_at_s = model_now_s
        save_history(path, h)


def anchor_clock(
    clock_start_s: float | None, time_scale: float, saved_at_s: float | None, wall_s: float
) -> ModelClock:
    """Model time starts when the app first serves (a slow deploy does not eat into a compressed
    day); with a fixed `clock_start_s`, a restart resumes where the history's last save left it."""
    start = wall_s if clock_start_s is None else clock_start_s
    if clock_start_s is not None and saved_at_s is not None and saved_at_s > start:
        start = saved_at_s
    return ModelClock(start_s=start, wall0_s=wall_s, time_scale=time_scale)
