"""The offline lane's outlook: its own forecast of live traffic, the cold-pool ask, and each
batch's completion estimate from that forecast.

The ingress sees every live request, so the lane keeps a forecast of its own
(autoscaling.forecast.Forecaster) fed with the ingress's live arrival rate: the cumulative
count of requests that reached pool choice, less the lane's own batch requests, turned into a
mean rate every FEED_EVERY_S (wall-clock epoch seconds: the forecast's profile is by time of
day). It is saved under the batch store (`lane_forecast.json`), so a restart keeps what it
learned.

Every PLAN_EVERY_S, `plan_lane` (pure, time passed in) projects the forecast's bins:

* the open batches, earliest deadline first, each with the remaining tokens of itself and every
  batch due before it, ask `scheduler.plan_cold_start`; the lane's ask of the cold pool is the
  largest advice, capped at `batch_api.max_cold_replicas`, and 0 whenever the live rate observed now
  is peak (above `offpeak_fraction` of the forecast's peak over the next day): at peak the cold
  pool is live traffic's, whatever the forecast says of the hours to come;
* each batch's completion estimate is `scheduler.estimate_completion` over the same bins, with
  the hot replicas plus the cold replicas asked for.

Batch throughput is measured, not configured: tokens answered per replica-second the lane held
(its idle-capacity accounting, persisted per batch), times `batch_api.slot_share`. Until a batch
has answered a line there is no measure: no ask, no estimate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autoscaling.forecast import ForecastConfig, Forecaster
from serving.batch.job import Job
from serving.batch.scheduler import ValleyModel, estimate_completion, plan_cold_start
from serving.batch.store import write_atomic

FEED_EVERY_S = 5.0  # live rate averaged over this long before it is one forecast observation
PLAN_EVERY_S = 10.0  # how often the ask and the estimates are recomputed
# The plan's bins: hourly at the finest. Each bin is one Forecaster.predict, whose cost grows
# with its lead; at the forecast's own 10-minute bins a day's plan stalled the ingress's event
# loop ~0.1 s on a 2-core machine, hourly ones take ~10 ms.
MIN_PLAN_BIN_S = 3600.0
SAVE_EVERY_S = 60.0  # how often the forecast is written to the store
FORECAST_FILE = "lane_forecast.json"
DAY_S = 86400.0
MIN_MEASURED_REPLICA_S = 0.05  # replica-seconds before the throughput measure is trusted


@dataclass(frozen=True, slots=True)
class BatchNeed:
    batch_id: str
    deadline_s: float  # epoch seconds (the batch's expires_at)
    remaining_tokens: float


@dataclass(frozen=True, slots=True)
class LanePlan:
    cold_replicas: int  # what the lane asks of the cold pool now
    reason: str
    estimates: dict[str, float | None]  # batch id -> epoch seconds it is done; None: not in view
    basis: str  # how the estimates were made


IDLE_PLAN = LanePlan(0, "no open batch", {}, "")
NO_MEASURE = "no measure yet"


def plan_bin_s(forecaster: Forecaster) -> float:
    return max(forecaster.cfg.bin_s, MIN_PLAN_BIN_S)


def forecast_bins(forecaster: Forecaster, now_s: float, num_bins: int) -> list[float]:
    """The forecast rate at the middle of each plan bin (plan_bin_s wide) from now on."""
    bin_s = plan_bin_s(forecaster)
    return [forecaster.predict(now_s, (i + 0.5) * bin_s).rate_at_lead_rps for i in range(num_bins)]


def num_bins_for(now_s: float, needs: Sequence[BatchNeed], bin_s: float) -> int:
    """Bins to the last deadline or a day ahead, whichever is later (the peak is a day's)."""
    until = max([now_s + DAY_S, *(n.deadline_s for n in needs)])
    return max(1, math.ceil((until - now_s) / bin_s))


def plan_lane(
    now_s: float,
    needs: Sequence[BatchNeed],
    rates_rps: Sequence[float],
    model: ValleyModel | None,
    live_rate_rps: float,
    max_cold_replicas: int,
) -> LanePlan:
    """The cold-pool ask and the completion estimates. `rates_rps[i]` is the forecast rate of the
    bin starting at now + i x bin_s and should cover at least a day."""
    if not needs:
        return IDLE_PLAN
    if model is None:
        return LanePlan(0, "no batch throughput measured yet", {}, NO_MEASURE)
    ordered = sorted(needs, key=lambda n: n.deadline_s)
    cumulative, total = [], 0.0
    for need in ordered:
        total += need.remaining_tokens
        cumulative.append(total)
    ask, reason = 0, "no batch is short of valley capacity"
    for need, tokens in zip(ordered, cumulative, strict=True):
        advice = plan_cold_start(
            now_s, need.deadline_s, tokens, rates_rps, model, max_cold_replicas
        )
        if advice.num_replicas > ask or not ask:
            ask, reason = advice.num_replicas, f"{need.batch_id}: {advice.reason}"
    day_peak = max(rates_rps[: max(1, round(DAY_S / model.bin_s))])
    if ask and live_rate_rps > model.offpeak_fraction * day_peak:
        ask, reason = (
            0,
            (
                f"live rate now {live_rate_rps:.2f} req/s is peak (> {model.offpeak_fraction:.0%} "
                f"of the day's forecast peak {day_peak:.2f}): no cold replica for batch work"
            ),
        )
    with_cold = dataclasses.replace(model, hot_replicas=model.hot_replicas + ask)
    estimates = {
        need.batch_id: estimate_completion(now_s, tokens, rates_rps, with_cold)
        for need, tokens in zip(ordered, cumulative, strict=True)
    }
    basis = (
        f"forecast valleys of {model.hot_replicas} replica(s)"
        + (f" + {ask} cold" if ask else "")
        + f" at {model.batch_tokens_per_replica_s:.1f} batch tokens/s per idle replica"
    )
    return LanePlan(ask, reason, estimates, basis)


def measured_tokens_per_replica_s(samples: Iterable[tuple[float, float]]) -> float | None:
    """(tokens answered, replica-seconds held) per batch -> tokens per replica-second."""
    tokens = replica_s = 0.0
    for t, r in samples:
        tokens, replica_s = tokens + t, replica_s + r
    if replica_s < MIN_MEASURED_REPLICA_S or tokens <= 0:
        return None
    return tokens / replica_s


def _answered_tokens(job: Job) -> float:
    return float((job.batch.get("usage") or {}).get("total_tokens", 0))


def batch_needs(open_jobs: Sequence[Job]) -> list[BatchNeed]:
    """Remaining tokens of each open batch: its unanswered lines x the mean tokens of an answered
    line (its own, else all batches'). A batch with nothing answered anywhere is not sized."""
    answered = sum(len(j.done) for j in open_jobs)
    lane_mean = sum(_answered_tokens(j) for j in open_jobs) / answered if answered else None
    needs = []
    for job in open_jobs:
        mean = _answered_tokens(job) / len(job.done) if job.done else lane_mean
        left = len(job.lines) - len(job.done)
        if mean is not None:
            needs.append(BatchNeed(job.batch["id"], float(job.batch["expires_at"]), left * mean))
    return needs


def valley_model(
    jobs: Iterable[Job], bin_s: float, replicas: int, capacity_rps: float, slot_share: float
) -> ValleyModel | None:
    """The ValleyModel from the lane's own measure: tokens per replica-second held, all batches
    (finished ones too: the record keeps both numbers), times the share of idle slots it takes."""
    per_s = measured_tokens_per_replica_s(
        (_answered_tokens(j), float(j.lane.get("replica_s", 0.0))) for j in jobs
    )
    if per_s is None:
        return None
    return ValleyModel(
        bin_s=bin_s,
        hot_replicas=max(1, replicas),
        replica_capacity_rps=capacity_rps,
        batch_tokens_per_replica_s=per_s * slot_share,
    )


class LaneOutlook:
    """The lane's forecast of live traffic, fed from the ingress's counts, saved in the store."""

    def __init__(self, root: pathlib.Path, cfg: ForecastConfig | None = None) -> None:
        self.path = pathlib.Path(root) / FORECAST_FILE
        self.forecaster = self._load(cfg)
        self.last_rate_rps = 0.0  # the live rate of the last FEED_EVERY_S
        self.plan = IDLE_PLAN
        self.planned_s = -math.inf
        self._planned_open = 0
        self._last: tuple[float, int] | None = None
        self._saved_s = -math.inf

    def _load(self, cfg: ForecastConfig | None) -> Forecaster:
        try:
            return Forecaster.from_dict(json.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return Forecaster(cfg)
        except (ValueError, KeyError, TypeError):  # a corrupt file: start over, say so
            import logging

            logging.getLogger("ray.serve").warning("batch lane: %s unreadable; new", self.path)
            return Forecaster(cfg)

    def count(self, now_s: float, live_total: int) -> None:
        """The ingress's cumulative live request count; every FEED_EVERY_S its mean rate is one
        forecast observation. A count that went back (a new ingress) starts over."""
        if self._last is None or live_total < self._last[1] or now_s < self._last[0]:
            self._last = (now_s, live_total)
            return
        since_s = now_s - self._last[0]
        if since_s >= FEED_EVERY_S:
            self.last_rate_rps = (live_total - self._last[1]) / since_s
            self.forecaster.observe(now_s, self.last_rate_rps)
            self._last = (now_s, live_total)

    def due(self, now_s: float, num_open: int) -> bool:
        """Every PLAN_EVERY_S, and at once when a batch opened or closed; every tick while an
        open batch waits for its first measure (a compressed day's batch may be done within one
        period)."""
        waiting = self.plan.basis == NO_MEASURE or num_open != self._planned_open
        return waiting or now_s - self.planned_s >= PLAN_EVERY_S

    def replan(
        self,
        now_s: float,
        num_open: int,
        needs: Sequence[BatchNeed],
        model: ValleyModel | None,
        max_cold: int,
    ) -> LanePlan:
        """`num_open` batches are in progress; `needs` are those that could be sized."""
        self.planned_s, self._planned_open = now_s, num_open
        if num_open and (model is None or len(needs) < num_open):
            self.plan = LanePlan(0, "no batch throughput measured yet", {}, NO_MEASURE)
            return self.plan
        bins = []
        if needs:
            bins = forecast_bins(
                self.forecaster, now_s, num_bins_for(now_s, needs, plan_bin_s(self.forecaster))
            )
        self.plan = plan_lane(now_s, needs, bins, model, self.last_rate_rps, max_cold)
        return self.plan

    def save(self, now_s: float, force: bool = False) -> None:
        if force or now_s - self._saved_s >= SAVE_EVERY_S:
            self._saved_s = now_s
            write_atomic(self.path, json.dumps(self.forecaster.to_dict()).encode())
