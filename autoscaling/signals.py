"""What the controller measures, reduced to the numbers the policy reads (pure; time passed in).

- `ReportBook`: the latest `ReplicaReport` each replica pushed (serving/llm/replica.py ->
  controller.report),
  aggregated over the replicas that reported recently: queue depth (waiting sequences, summed)
  and queue wait (the worst replica's p99), the emergency signals of R9.
- `RateMeter`: the ingress's cumulative request count turned into a rate.
- `ModelClock`: wall time mapped to the controller's model time. time_scale = 1 is real time;
  a larger scale compresses a day (tests and demos: time_scale = 720 plays a day in 2 minutes).
  Only the time axis is scaled: rates stay in requests per real second, because replicas serve
  real requests at a real pace. Durations measured on the wall (cold starts) are converted to
  model seconds with `to_model_s` before they reach the policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving.llm.messages import ReplicaReport

if TYPE_CHECKING:
    from serving.config.sections import ControllerSection

_MINUTES_PER_DAY = 1440


@dataclass(frozen=True, slots=True)
class PoolSignals:
    queue_depth: int  # waiting sequences over all fresh reports
    queue_wait_s: float  # worst replica p99 queue wait
    num_reporting: dict[str, int]  # replicas with a fresh report, per pool
    kv_use_fraction: float  # mean over reporting replicas (0 when none)
    adapter_miss_s_per_request: float = 0.0  # adapter_miss_s_per_request over them


class ReportBook:
    """Latest report per replica; reports older than max_age_s are ignored (the replica is gone
    or stuck, and its last numbers must not pin an emergency scale-up forever)."""

    def __init__(self) -> None:
        self._latest: dict[str, tuple[float, ReplicaReport]] = {}

    def record(self, report: ReplicaReport, t_s: float) -> None:
        self._latest[report.replica_id] = (t_s, report)

    def signals(self, now_s: float, max_age_s: float) -> PoolSignals:
        fresh = [r for t, r in self._latest.values() if now_s - t <= max_age_s]
        # Forget the stale ones so the book does not grow with every replica ever started.
        self._latest = {k: v for k, v in self._latest.items() if now_s - v[0] <= max_age_s}
        counts: dict[str, int] = {}
        for r in fresh:
            counts[r.pool] = counts.get(r.pool, 0) + 1
        return PoolSignals(
            queue_depth=sum(r.num_waiting for r in fresh),
            queue_wait_s=max((r.queue_wait_p99_s for r in fresh), default=0.0),
            num_reporting=counts,
            kv_use_fraction=_mean(r.kv_use_fraction for r in fresh),
            adapter_miss_s_per_request=adapter_miss_s_per_request(
                (r.window_requests, r.lora_load_s) for r in fresh
            ),
        )


def adapter_miss_s_per_request(windows: Iterable[tuple[int, float]]) -> float:
    """LoRA slot-load seconds per request over the replicas' last windows ((requests, load
    seconds) each): the pool's mean, each replica weighted by its traffic. Base-model requests
    count (they wait through a load like the others); 0 when no request was served."""
    num_requests = load_s = 0.0
    for num, seconds in windows:
        num_requests += num
        load_s += seconds
    return load_s / num_requests if num_requests > 0 else 0.0


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


class RateMeter:
    """Requests per second between two readings of a cumulative counter."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None
        # the middle of the span the last rate was measured over: the time the rate belongs to
        self.mid_s: float | None = None

    def update(self, cumulative: int, t_s: float) -> float | None:
        """The rate since the previous reading; None on the first one, after a counter reset
        (the ingress restarted) or when no time passed. None is a missing window, not zero."""
        last, self._last = self._last, (t_s, cumulative)
        if last is None or cumulative < last[1] or t_s <= last[0]:
            self.mid_s = None
            return None
        self.mid_s = (last[0] + t_s) / 2
        return (cumulative - last[1]) / (t_s - last[0])


@dataclass(frozen=True, slots=True)
class ModelClock:
    """model_s = start_s + (wall_s - wall0_s) * time_scale."""

    start_s: float
    wall0_s: float
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale={self.time_scale!r} is out of range; allowed: > 0")

    def now(self, wall_s: float) -> float:
        return self.start_s + (wall_s - self.wall0_s) * self.time_scale

    def to_model_s(self, wall_duration_s: float) -> float:
        return wall_duration_s * self.time_scale

    def to_wall_s(self, model_duration_s: float) -> float:
        return model_duration_s / self.time_scale


def lead_override_s(ctl: ControllerSection, model_now_s: float) -> float | None:
    """The `lead_overrides` window's lead at this model time (UTC), or None outside every window
    (the policy then uses the measured p95 cold start + margin)."""
    minute = int(model_now_s // 60) % _MINUTES_PER_DAY
    for override in ctl.lead_overrides:
        if minute in override.minutes():
            return override.lead_s
    return None
