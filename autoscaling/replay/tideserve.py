"""tideserve in the replay: the same Forecaster, HeadroomLearner and tick() the controller runs."""

from __future__ import annotations

import math

import numpy as np

from autoscaling import step
from autoscaling.forecast import ForecastConfig, Forecaster
from autoscaling.headroom import HeadroomConfig, HeadroomLearner
from autoscaling.policy import PolicyConfig, PolicyState, lead_s_for
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
        headroom: HeadroomConfig | None = None,
    ) -> None:
        self.name, self.cfg = name, cfg
        self.hot_replicas = cfg.hot_replicas
        self.forecaster = forecaster or Forecaster(ForecastConfig())
        self.learner = HeadroomLearner(headroom)
        self.state = PolicyState.initial()
        self._p95 = cold_start_p95_s
        self._override = lead_override_s
        self.last_decision = None

    def train(self, t0_s: float, bin_s: float, rates_rps: np.ndarray) -> None:
        """Observe a history of window-mean rates (NaN = gap) before the replay starts."""
        rates = [None if np.isnan(r) else float(r) for r in rates_rps]
        cfg = self.cfg.for_cold_start(self._p95)  # as step.tick will run
        lead = lead_s_for(cfg, self._p95, None)
        step.train(self.forecaster, self.learner, cfg, t0_s, bin_s, rates, lead)

    def tick(self, now_s: float, obs: Observation) -> Targets:
        seen = step.Observed(
            rate_rps=obs.rate_rps,
            hot_ready=obs.hot_ready,
            cold_ready=obs.cold_ready,
            cold_starting=obs.cold_starting,
            queue_depth=int(obs.queue_depth),
            queue_wait_s=obs.queue_wait_s,
            refused_rps=obs.refused_rps,
            cold_start_p95_s=self._p95,
            lead_override_s=self._override(now_s) if self._override else None,
        )
        decision, self.state, fc = step.tick(
            self.forecaster, self.learner, self.state, self.cfg, seen, now_s
        )
        self.last_decision = decision
        planned = decision.details.get("planned_rps", fc.peak_rps)
        return Targets(decision.cold_target, decision.reason, decision.emergency, planned)
