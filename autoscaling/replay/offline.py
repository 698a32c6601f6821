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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.validate import check_range

DAY_S = 86400


@dataclass(frozen=True)
class OfflineLoad:
    _owner = "OfflineLoad"

    requests_per_day: float  # offline requests submitted at each day's start
    slot_share: float = 0.5  # batch.slot_share: the share of idle capacity the lane may fill

    def __post_init__(self) -> None:
        check_range(self._owner, "requests_per_day", self.requests_per_day, 0.0, None)
        check_range(self._owner, "slot_share", self.slot_share, 0.0, 1.0, lo_open=True)


def fill_valleys(
    arrivals: np.ndarray, ready: np.ndarray, t0_s: float, capacity_rps: float, load: OfflineLoad
) -> dict:
    """`arrivals` and `ready` per second from t0_s (a SimResult's `ready`)."""
    n = len(arrivals)
    idle = np.maximum(0.0, ready * capacity_rps - arrivals)
    lane = idle * load.slot_share
    day = ((t0_s + np.arange(n)) // DAY_S).astype(np.int64)
    served = np.zeros(n)
    days_met = days = 0
    left = 0.0
    for d in np.unique(day):
        idx = np.flatnonzero(day == d)
        full_day = (d + 1) * DAY_S <= t0_s + n  # a partial last day is reported, not judged
        cum = np.cumsum(lane[idx])
        take = np.minimum(cum, load.requests_per_day)
        served[idx] = np.diff(take, prepend=0.0)
        left = load.requests_per_day - float(take[-1]) if len(take) else load.requests_per_day
        if full_day:
            days += 1
            days_met += left <= 1e-9
    used_s = served / capacity_rps
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
    }
