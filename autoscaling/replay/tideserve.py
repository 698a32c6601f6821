"""tideserve in the replay: the same Forecaster and decide() the controller actor runs."""

from __future__ import annotations

import math

import numpy as np

from autoscaling.forecast import ForecastConfig, Forecaster
from autoscaling.policy import PolicyConfig, PolicyState, Snapshot, decide, lead_s_for
from autoscaling.replay.sim import Observation, Targets


def learn_hot_replicas(train_rates_rps: np.ndarray, cfg: PolicyConfig, quantile: float) -> int:
    """Hot pool from training traffic: replicas for the rate exceeded (1 - quantile) of the time.

    Below the daily trough the forecast-driven cold pool adds the rest, so a low quantile costs
    nothing at night and keeps a floor that never waits for a cold start.
    """
    rates = train_rates_rps[np.isfinite(train_rates_rps)]
    if not len(rates):
        return cfg.hot_replicas
    level = float(np.quantile(rates, quantile))
    per_replica = cfg.replica_capacity_rps * cfg.target_utilization
    return max(math.ceil(level / per_replica - 1e-9), 1)


class TideserveController:
    def __init__(
        self,
        cfg: PolicyConfig,
        forecaster: Forecaster | None = None,
        cold_start_p95_s: float | None = None,
        lead_override_s=None,  # callable(now_s) -> float | None: per-window lead (cluster.yaml)
        name: str = "tideserve",
    ) -> None:
        self.name, self.cfg = name, cfg
        self.hot_replicas = cfg.hot_replicas
        self.forecaster = forecaster or Forecaster(ForecastConfig())
        self.state = PolicyState.initial()
        self._p95 = cold_start_p95_s
        self._override = lead_override_s
        self.last_decision = None

    def train(self, t0_s: float, bin_s: float, rates_rps: np.ndarray) -> None:
        """Observe a history of window-mean rates (NaN = gap) before the replay starts."""
        for i, r in enumerate(rates_rps):
            self.forecaster.observe(t0_s + (i + 0.5) * bin_s, None if np.isnan(r) else float(r))

    def tick(self, now_s: float, obs: Observation) -> Targets:
        self.forecaster.observe(now_s, obs.rate_rps)
        override = self._override(now_s) if self._override else None
        lead = lead_s_for(self.cfg, self._p95, override)
        fc = self.forecaster.predict(now_s, lead, self.cfg.horizon_s)
        snap = Snapshot(
            hot_replicas=obs.hot_ready,
            cold_ready=obs.cold_ready,
            cold_starting=obs.cold_starting,
            rate_rps=obs.rate_rps if obs.rate_rps is not None else fc.level_rps,
            queue_depth=int(obs.queue_depth),
            queue_wait_s=obs.queue_wait_s,
            forecast=fc,
            cold_start_p95_s=self._p95,
            lead_s=override,
        )
        decision, self.state = decide(snap, self.state, self.cfg, now_s)
        self.last_decision = decision
        planned = decision.details.get("planned_rps", fc.peak_rps)
        return Targets(decision.cold_target, decision.reason, decision.emergency, planned)
