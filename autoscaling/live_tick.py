"""One live tick, shared by both live scalers: Serve's policy (autoscaling/policy_runtime.py) and
the external-scaler actor (autoscaling/controller.py).

    view (what the adapter read)  -> rates from the ingress's cumulative counts (LiveMeters)
                                  -> step.Observed (rate, refusals, queue, cold starts, lead,
                                     the batch lane's ask)
                                  -> ScalerMemory.tick (step.tick: observe, forecast, decide)
                                  -> LiveTick (decision, forecast, the history record)

Each adapter only reads (Serve's contexts, or Serve's replica states and the replicas' pushed
reports) into a `PoolView` and applies the target its own way; everything between is here, so
the two cannot drift apart again (the actor once dropped the batch lane's cold-replica ask).
Time comes in (wall seconds); nothing here reads a clock or calls Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autoscaling import step
from autoscaling.cold_start import ColdStartTracker
from autoscaling.forecast import Forecast
from autoscaling.history_store import decision_record
from autoscaling.memory import ScalerMemory
from autoscaling.policy import Decision, PolicyConfig
from autoscaling.signals import ModelClock, RateMeter, lead_override_s
from serving.llm.autoscaling_stats import IngressStats


@dataclass(frozen=True, slots=True)
class PoolView:
    """One tick's reading of the app, whichever scaler read it."""

    ingress: IngressStats | None  # None: no fresh report (ingress starting or restarting)
    ingress_sample_s: float | None  # wall time of that report (the rate's time axis)
    hot_running: int
    cold_running: int
    cold_target: int  # the cold replicas Serve is to have (running + starting)
    queue_depth: int  # waiting sequences over hot and cold replicas with a fresh report
    queue_wait_s: float  # worst replica's p99 queue wait
    # LoRA slot-load seconds per admitted request over the replicas' last windows (signals.py)
    adapter_miss_s_per_request: float = 0.0


@dataclass(slots=True)
class LiveMeters:
    """The ingress's cumulative request and refusal (429) counts turned into rates."""

    rate: RateMeter = field(default_factory=RateMeter)
    refused: RateMeter = field(default_factory=RateMeter)

    def read(self, ingress: IngressStats | None, sample_s: float | None):
        """(requests/s, refused/s) since the last reading; (None, None) while the ingress is
        unreachable: a missing window, and the next reading spans the gap."""
        if ingress is None or sample_s is None:
            return None, None
        return (
            self.rate.update(ingress.num_requests, sample_s),
            self.refused.update(ingress.num_refused, sample_s),
        )


@dataclass(frozen=True, slots=True)
class LiveTick:
    decision: Decision
    forecast: Forecast
    rate_rps: float | None
    model_now_s: float
    record: dict[str, Any]  # the history's decision record (autoscaling/history_store.py)


def observed(
    view: PoolView,
    rate_rps: float | None,
    refused_rps: float | None,
    rate_mid_s: float | None,
    cold_start_p95_wall_s: float | None,
    clock: ModelClock,
    ctl: Any,  # the app's controller section (lead_overrides)
    model_now_s: float,
) -> step.Observed:
    """What the policy sees, in model time, from one view."""
    return step.Observed(
        rate_rps=rate_rps,
        hot_ready=view.hot_running,
        cold_ready=view.cold_running,
        cold_starting=max(0, view.cold_target - view.cold_running),
        queue_depth=view.queue_depth,
        queue_wait_s=view.queue_wait_s,
        cold_start_p95_s=None
        if cold_start_p95_wall_s is None
        else clock.to_model_s(cold_start_p95_wall_s),
        lead_override_s=lead_override_s(ctl, model_now_s),
        offline_cold_replicas=0 if view.ingress is None else view.ingress.offline_cold_replicas,
        refused_rps=refused_rps or 0.0,
        # the ingress's counts span its previous report to this one
        rate_at_s=None if rate_rps is None or rate_mid_s is None else clock.now(rate_mid_s),
        # engine seconds per request: the wall is the replicas' clock, not the model's
        adapter_miss_s_per_request=view.adapter_miss_s_per_request,
    )


def live_tick(
    memory: ScalerMemory,
    meters: LiveMeters,
    clock: ModelClock,
    ctl: Any,
    policy_cfg: PolicyConfig,
    view: PoolView,
    wall_s: float,
) -> LiveTick:
    """One tick on the scaler's memory: the forecaster and learner learn, the state advances."""
    model_now = clock.now(wall_s)
    rate, refused = meters.read(view.ingress, view.ingress_sample_s)
    p95_wall = memory.tracker.p95_s()
    seen = observed(view, rate, refused, meters.rate.mid_s, p95_wall, clock, ctl, model_now)
    decision, forecast = memory.tick(policy_cfg, seen, model_now)
    record = decision_record(
        model_now, wall_s, decision, forecast, rate, view.hot_running, view.cold_running, view
    )
    return LiveTick(decision, forecast, rate, model_now, record)


def note_cold_target(tracker: ColdStartTracker, previous: int, target: int, wall_s: float) -> None:
    """A raised cold target starts cold-start clocks; a lowered one cancels pending ones."""
    if target > previous:
        tracker.requested(target - previous, wall_s)
    elif target < previous:
        tracker.cancelled(previous - target)
