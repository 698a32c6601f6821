"""The replay's clock: step a controller over per-second arrivals, interval by interval.

Each `interval_s` the controller sees what a real controller would (the arrival rate of the last
interval, None inside a trace gap, refused requests counted in it; the refusals (429) of a service
model that admits; queue depth and wait; ready and starting replicas) and returns
targets. A replica asked for at t is ready at t + cold_start_s and costs GPU time from t (it is
loading on a GPU); with `draw_cold_starts` each start draws its own length instead
(autoscaling/replay/cold_starts.py). Scale-down cancels starting replicas first, the ones due
last first, then drains ready ones (the fluid model finishes their in-flight work at once).
Between ticks the service model runs the queue second by second, vectorised over the interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from autoscaling.replay.service import ServiceModel


@dataclass(frozen=True)
class Observation:
    rate_rps: float | None  # None: the trace has no data here (collection gap)
    queue_depth: float
    queue_wait_s: float
    hot_ready: int
    cold_ready: int
    cold_starting: int
    refused_rps: float = 0.0  # requests refused (429) per second over the last interval


@dataclass(frozen=True)
class Targets:
    cold: int
    reason: str = ""
    emergency: bool = False
    forecast_rps: float = float("nan")  # what the controller planned for (plotted)


class SimController(Protocol):
    name: str
    hot_replicas: int

    def tick(self, now_s: float, obs: Observation) -> Targets: ...


@dataclass
class SimResult:
    name: str
    replicas: np.ndarray  # per second: hot + cold ready + cold starting (GPU-holding)
    ready: np.ndarray  # per second: replicas serving
    queue: np.ndarray
    ttft_s: np.ndarray  # of the second's admitted requests
    refused: np.ndarray  # per second: requests refused (429), each an SLO violation
    forecast_rps: np.ndarray  # per tick
    num_scale_events: int
    num_emergencies: int
    reasons: list[str] = field(default_factory=list)  # the last few, for the report


@dataclass
class _ColdPool:
    """The elastic pool: replicas ready, and starting ones by their ready-at time, soonest first."""

    draw: Callable[[int], list[float]]  # n starts' lengths
    ready: int = 0
    starting: list[float] = field(default_factory=list)

    def apply(self, target: int, now_s: float) -> None:
        """Start replicas up to `target` (each ready its drawn length after `now_s`) or stop down
        to it, the ones still starting first, due last first (cancelling a start costs nothing)."""
        have = self.ready + len(self.starting)
        if target > have:
            self.starting.extend(now_s + d for d in self.draw(target - have))
            self.starting.sort()
        elif target < have:
            drop = have - target
            cancel = min(drop, len(self.starting))
            del self.starting[len(self.starting) - cancel :]
            self.ready -= drop - cancel

    def serving(self, secs: np.ndarray) -> np.ndarray:
        """Per second of `secs`: the pool's replicas serving (ready, or their start done)."""
        up = np.full(len(secs), float(self.ready))
        for at in self.starting:
            up += secs >= at
        return up

    def advance(self, until_s: float) -> None:
        """The starts due before `until_s` are ready."""
        became = sum(at < until_s for at in self.starting)
        self.ready += became
        del self.starting[:became]


def simulate(
    ctl: SimController,
    arrivals: np.ndarray,
    observed: np.ndarray,
    t0_s: float,
    service: ServiceModel,
    interval_s: int,
    cold_start_s: float,
    warm_start: bool = True,
    draw_cold_starts: Callable[[int], list[float]] | None = None,
) -> SimResult:
    """Run `ctl` over `arrivals` (requests per second); `observed` is the per-second rate the
    controller may see (NaN in gaps). Seconds are t0_s + index. With warm_start the first
    tick's cold target is ready at once (the replay starts mid-trace, not from an empty pool).
    `draw_cold_starts(n)` gives n starts' lengths (ColdStarts.sampler); None: all cold_start_s."""
    pool = _ColdPool(draw_cold_starts or (lambda k: [cold_start_s] * k))
    n = len(arrivals)
    hot = ctl.hot_replicas
    replicas = np.empty(n)
    ready = np.empty(n)
    queue = np.empty(n)
    ttft = np.empty(n)
    refused = np.zeros(n)
    fc = np.full((n + interval_s - 1) // interval_s, np.nan)
    q, last_target, events, emergencies = 0.0, None, 0, 0
    reasons: list[str] = []
    wait, refused_rps = 0.0, 0.0
    for k, lo in enumerate(range(0, n, interval_s)):
        now = t0_s + lo
        # the first tick sees the first interval: the replay starts mid-trace, controllers primed
        seen = observed[max(lo - interval_s, 0) : lo] if lo else observed[:interval_s]
        rate = float(seen.mean()) if len(seen) and not np.isnan(seen).any() else None
        obs = Observation(rate, q, wait, hot, pool.ready, len(pool.starting), refused_rps)
        tgt = ctl.tick(now, obs)
        fc[k] = tgt.forecast_rps
        emergencies += tgt.emergency
        if tgt.cold != last_target:
            events += last_target is not None
            last_target = tgt.cold
            reasons = [*reasons[-4:], f"t={now:.0f}s {tgt.reason}"]
        if warm_start and k == 0:
            pool.ready = tgt.cold
        pool.apply(tgt.cold, now)
        hi = min(lo + interval_s, n)
        up = hot + pool.serving(t0_s + np.arange(lo, hi))
        total = hot + pool.ready + len(pool.starting)
        q_int, t_int, refused[lo:hi] = service.queue(arrivals[lo:hi], up, q)
        replicas[lo:hi], ready[lo:hi], queue[lo:hi], ttft[lo:hi] = total, up, q_int, t_int
        refused_rps = float(refused[lo:hi].mean())
        q = float(q_int[-1])
        wait = q / max(float(up[-1]) * service.replica_capacity_rps, 1e-9)
        pool.advance(t0_s + hi)
    return SimResult(
        ctl.name, replicas, ready, queue, ttft, refused, fc, events, emergencies, reasons
    )
