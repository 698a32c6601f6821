"""Offline volume in the replay: a daily batch fills the capacity live traffic leaves idle (pure).

The live simulation runs first (autoscaling/replay/sim.py); this pass then models the offline
lane (serving/batch/) on its result, second by second:

    idle(s)    = max(0, ready(s) x capacity - arrivals(s))        requests/s live traffic leaves
    lane(s)    = idle(s) x slot_share                               what the lane may take
    served(s)  = min(lane(s), backlog(s))                           backlog: the day's batch
    used(s)    = served(s) / capacity                               replica-seconds (GPU-seconds)

Each trace day (UTC of the trace clock) submits `requests_per_day` offline requests at 00:00,
due by the day's end. The lane only takes idle capacity and yields when live traffic needs it,
so the live queue and TTFT of the first pass are left as they are (the engine's offline tier
never blocks higher tiers). Reported: the valley GPU-hours the lane used, the idle GPU-hours
before and after, and how many days' batches finished inside their day.

With `max_cold_replicas` > 0, every hour the lane asks serving/batch/scheduler.plan_cold_start
whether the rest of the day's valleys carry the rest of the batch, with the previous day's
hourly live rates as the forecast (seasonal naive); when it advises a cold start (off-peak
only, never at peak), that many extra replicas run the batch for the hour, and their GPU-hours
are reported apart from the valley GPU-hours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.validate import check_range
from serving.batch.scheduler import ValleyModel, plan_cold_start

DAY_S = 86400


@dataclass(frozen=True)
class OfflineLoad:
    _owner = "OfflineLoad"

    requests_per_day: float  # offline requests submitted at each day's start
    slot_share: float = 0.5  # batch_api.slot_share: the share of idle capacity the lane may fill
    max_cold_replicas: int = 0  # extra replicas a short day may start off-peak; 0: never

    def __post_init__(self) -> None:
        check_range(self._owner, "requests_per_day", self.requests_per_day, 0.0, None)
        check_range(self._owner, "slot_share", self.slot_share, 0.0, 1.0, lo_open=True)
        check_range(self._owner, "max_cold_replicas", self.max_cold_replicas, 0, None, integer=True)


def _cold_lane(arrivals, ready, idx, lane, capacity_rps, load) -> tuple[np.ndarray, float]:
    """Extra lane capacity per second of the day `idx` from cold replicas started for the batch,
    and their GPU-hours. Each hour the lane asks plan_cold_start with what is left of the batch
    and of the day's forecast (the previous day's hourly rates); a day without a previous one in
    the trace gets no cold start."""
    extra = np.zeros(len(idx))
    first = int(idx[0])
    if not load.max_cold_replicas or len(idx) != DAY_S or first < DAY_S:
        return extra, 0.0
    rates = arrivals[first - DAY_S : first].reshape(24, 3600).mean(axis=1)  # seasonal naive
    model = ValleyModel(
        bin_s=3600.0,
        hot_replicas=max(1, int(ready[idx].min())),
        replica_capacity_rps=capacity_rps,
        batch_tokens_per_replica_s=capacity_rps * load.slot_share,  # requests, not tokens, here
    )
    done, gpu_hours = 0.0, 0.0
    for h in range(24):
        remaining = load.requests_per_day - done
        if remaining <= 0:
            break
        now = h * 3600.0
        advice = plan_cold_start(
            now, DAY_S, remaining, list(rates[h:]), model, load.max_cold_replicas
        )
        hour = slice(h * 3600, (h + 1) * 3600)
        if advice.start_cold:
            extra[hour] = advice.num_replicas * capacity_rps * load.slot_share
            gpu_hours += advice.num_replicas
        done += float(lane[idx][hour].sum() + extra[hour].sum())
    return extra, gpu_hours


def fill_valleys(
    arrivals: np.ndarray, ready: np.ndarray, t0_s: float, capacity_rps: float, load: OfflineLoad
) -> dict:
    """`arrivals` and `ready` per second from t0_s (a SimResult's `ready`)."""
    n = len(arrivals)
    idle = np.maximum(0.0, ready * capacity_rps - arrivals)
    lane = idle * load.slot_share
    day = ((t0_s + np.arange(n)) // DAY_S).astype(np.int64)
    served = np.zeros(n)
    boosts = np.zeros(n)  # lane capacity of cold replicas started for the batch
    days_met = days = 0
    left = 0.0
    cold_gpu_hours, cold_days = 0.0, 0
    for d in np.unique(day):
        idx = np.flatnonzero(day == d)
        full_day = (d + 1) * DAY_S <= t0_s + n  # a partial last day is reported, not judged
        boost, hours = _cold_lane(arrivals, ready, idx, lane, capacity_rps, load)
        if load.max_cold_replicas and hours:
            cold_gpu_hours, cold_days = cold_gpu_hours + hours, cold_days + 1
        boosts[idx] = boost
        cum = np.cumsum(lane[idx] + boost)
        take = np.minimum(cum, load.requests_per_day)
        served[idx] = np.diff(take, prepend=0.0)
        left = load.requests_per_day - float(take[-1]) if len(take) else load.requests_per_day
        if full_day:
            days += 1
            days_met += left <= 1e-9
    total = lane + boosts
    share = np.divide(lane, total, out=np.zeros(n), where=total > 0)
    used_s = served * share / capacity_rps  # the valley part; the cold part is reported apart
    idle_s = idle / capacity_rps
    return {
        "requests_per_day": load.requests_per_day,
        "slot_share": load.slot_share,
        "offline_served": float(served.sum()),
        "offline_left_last_day": left,
        "valley_gpu_hours_used": float(used_s.sum() / 3600.0),
        "idle_gpu_hours_before": float(idle_s.sum() / 3600.0),
        "idle_gpu_hours_after": float((idle_s - used_s).sum() / 3600.0),
        "days_judged": days,
        "days_batch_done": days_met,
        "max_cold_replicas": load.max_cold_replicas,
        "days_cold_started": cold_days,
        "cold_gpu_hours_for_batch": cold_gpu_hours,
    }
