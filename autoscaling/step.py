"""One controller tick, shared by the live controller and the replay: observe, forecast, decide.

    cfg      = cfg.for_cold_start(measured p95)                  (time protections to the start)
    forecaster.observe(now, rate); learner.observe(now, rate)    (scores plans now due)
    learner.feedback_on(now, rate, in distress: queue or refusals)  (the SLO's own feedback)
    fc       = forecaster.predict(now, lead, horizon); the rate's recent mean and trend
    headroom = learner.headroom(now + lead)                     (the band the plan serves in)
    decision = decide(snapshot with fc and headroom, state, cfg, now)
    learner.expect(now + lead .. + horizon, base)                (scored when the span ends)

Time comes in; nothing here reads a clock, so the replay and the tests step it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaling.forecast import Forecast, Forecaster
from autoscaling.headroom import HeadroomLearner
from autoscaling.policy import (
    Decision,
    PolicyConfig,
    PolicyState,
    Snapshot,
    decide,
    in_distress,
    lead_s_for,
)


@dataclass(frozen=True, slots=True)
class Observed:
    """What the controller saw this tick (rate None: no data, e.g. a trace gap)."""

    rate_rps: float | None
    hot_ready: int
    cold_ready: int
    cold_starting: int
    queue_depth: int
    queue_wait_s: float
    cold_start_p95_s: float | None = None
    lead_override_s: float | None = None
    offline_cold_replicas: int = 0  # the batch lane's ask (a floor on the cold target)
    refused_rps: float = 0.0  # of rate_rps, requests refused for capacity (429)
    # the time the rate was measured at (the middle of its counting span), when it is not now:
    # a rate counted over the last interval and reported late belongs to that interval, and
    # stamping it "now" compares a ramp's old rate with the profile of its new level
    rate_at_s: float | None = None
    # engine seconds of LoRA slot loads per admitted request (the replicas' last windows)
    adapter_miss_s_per_request: float = 0.0


def tick(
    forecaster: Forecaster,
    learner: HeadroomLearner,
    state: PolicyState,
    cfg: PolicyConfig,
    obs: Observed,
    now_s: float,
) -> tuple[Decision, PolicyState, Forecast]:
    cfg = cfg.for_cold_start(obs.cold_start_p95_s)  # time protections sized to the start
    seen_at_s = now_s if obs.rate_at_s is None else min(obs.rate_at_s, now_s)
    forecaster.observe(seen_at_s, obs.rate_rps)
    learner.observe(seen_at_s, obs.rate_rps)
    ready = obs.hot_ready + obs.cold_ready
    rate = obs.rate_rps or 0.0
    miss_s = obs.adapter_miss_s_per_request
    distress = in_distress(
        obs.queue_wait_s, obs.queue_depth, ready, cfg, obs.refused_rps, rate, miss_s
    )
    learner.feedback_on(now_s, obs.rate_rps, distress)
    lead = lead_s_for(cfg, obs.cold_start_p95_s, obs.lead_override_s)
    fc = forecaster.predict(now_s, lead, cfg.horizon_s)
    head = learner.headroom(now_s + lead)
    trend = forecaster.trend_rps(now_s, cfg.trend_window_s, lead) if cfg.trend_window_s else None
    recent = forecaster.mean_rps(now_s, cfg.rate_window_s) if cfg.rate_window_s else None
    snap = Snapshot(
        hot_replicas=obs.hot_ready,
        cold_ready=obs.cold_ready,
        cold_starting=obs.cold_starting,
        rate_rps=obs.rate_rps if obs.rate_rps is not None else fc.level_rps,
        queue_depth=obs.queue_depth,
        queue_wait_s=obs.queue_wait_s,
        forecast=fc,
        refused_rps=obs.refused_rps,
        cold_start_p95_s=obs.cold_start_p95_s,
        lead_s=obs.lead_override_s,
        headroom=head.factor,
        headroom_basis=head.basis,
        offline_cold_replicas=obs.offline_cold_replicas,
        adapter_miss_s_per_request=miss_s,
        trend_rps=trend,
        recent_rate_rps=recent,
    )
    decision, state = decide(snap, state, cfg, now_s)
    learner.expect(now_s + lead, now_s + lead + cfg.horizon_s, decision.details["base_rps"])
    return decision, state, fc


def train(
    forecaster: Forecaster,
    learner: HeadroomLearner,
    cfg: PolicyConfig,
    t0_s: float,
    bin_s: float,
    rates_rps: list[float | None],
    lead_s: float,
) -> None:
    """Learn from a history of window-mean rates (None = gap): the forecaster's profile and the
    volatility classes' jumps. With `score_training_windows` each window is also forecast before
    it is observed and scored, so the headroom starts from the training days' errors; off (the
    default), it starts at the R6 factor and learns from live plans, as the live controller does."""
    score = learner.cfg.score_training_windows
    for i, rate in enumerate(rates_rps):
        t = t0_s + (i + 0.5) * bin_s
        # predicted even when not scored: predict() also keeps the level ratio the forecaster
        # falls back to in a gap, so training ends in the same state either way
        fc = forecaster.predict(t, lead_s, cfg.horizon_s)
        if score:
            learner.expect(t - 1.0, t, max(fc.peak_rps, fc.level_rps))  # scored by this window
        forecaster.observe(t, rate)
        learner.observe(t, rate)
