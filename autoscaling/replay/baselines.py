"""The replay's baseline controllers, each deciding every interval from what it can observe.

* static: a fixed number of replicas (static_peak / static_mean).
* reactive: Ray Serve's default policy. desired = ceil(ongoing / target_ongoing_requests) over a
  30 s look-back; upscale only after the wish lasted upscale_delay_s (30 s), downscale after
  downscale_delay_s (600 s). In the fluid model ongoing = rate x mean_e2e_s + queue, and
  target_ongoing_requests = target_utilization x the ongoing requests one replica holds at
  capacity (replica_capacity_rps x mean_e2e_s), so desired = ceil((rate + queue / e2e) / (cap x u)).
* knative: KPA. Stable window 60 s, panic window 6 s (here: the last tick's interval), panic
  when the panic-window desire is >= 2x the ready replicas; in panic it never scales down; scale
  down at most halves per tick.
* rule_70_30 (R6): hot fixed at 70% of the (training) daily peak, the cold rest reactive.
* oracle: knows every future per-second arrival; at t it holds exactly the replicas needed at 100%
  capacity for any second of [t, t + cold_start + interval] (a replica needed later must start
  now). A clairvoyant plan with zero SLO violations, the cheapest such plan in a replay; not a
  lower bound on GPU-hours, since the SLO tolerates short queues that it never lets form.
* rate_oracle: knows the rate curve ahead (not the arrivals drawn from it) and holds what its
  highest rate over the same look-ahead needs, plus the queue margin for that rate's Poisson
  arrivals: the yardstick for any forecast of the rate, however good.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from autoscaling.policy import PolicyConfig, queue_margin_rps
from autoscaling.replay.sim import Observation, Targets


def replicas_for(rate_rps: float, capacity_rps: float, utilization: float) -> int:
    return max(math.ceil(rate_rps / (capacity_rps * utilization) - 1e-9), 0)


class StaticController:
    def __init__(self, name: str, replicas: int) -> None:
        self.name, self.hot_replicas, self._n = name, replicas, replicas

    def tick(self, now_s: float, obs: Observation) -> Targets:
        return Targets(0, f"static {self._n} replicas")


class _Window:
    """Time-stamped samples kept for `span_s`; mean of those present."""

    def __init__(self, span_s: float) -> None:
        self.span_s, self.items = span_s, deque()

    def add(self, t: float, v: float) -> float:
        self.items.append((t, v))
        while self.items[0][0] <= t - self.span_s:
            self.items.popleft()
        return sum(x for _, x in self.items) / len(self.items)


class ReactiveController:
    """Ray Serve's default autoscaling policy over `hot_replicas` fixed + the rest elastic."""

    def __init__(
        self,
        name: str,
        capacity_rps: float,
        utilization: float,
        mean_e2e_s: float,
        hot_replicas: int = 1,
        max_replicas: int = 10**6,
        upscale_delay_s: float = 30.0,
        downscale_delay_s: float = 600.0,
        look_back_s: float = 30.0,
    ) -> None:
        self.name, self.hot_replicas = name, hot_replicas
        self._cap, self._u, self._e2e, self._max = (
            capacity_rps,
            utilization,
            mean_e2e_s,
            max_replicas,
        )
        self._up_s, self._down_s = upscale_delay_s, downscale_delay_s
        self._window = _Window(look_back_s)
        self._rate = 0.0
        self._cold, self._primed = 0, False
        self._wish_since: tuple[int, float] | None = None  # (direction, since)

    def tick(self, now_s: float, obs: Observation) -> Targets:
        if obs.rate_rps is not None:
            self._rate = obs.rate_rps
        load = self._window.add(now_s, self._rate + obs.queue_depth / self._e2e)
        desired = min(max(replicas_for(load, self._cap, self._u), 1), self._max)
        cold_want = max(desired - self.hot_replicas, 0)
        if self._wish_since is None and not self._primed:  # start at the level of the trace
            self._cold, self._primed = cold_want, True
        direction = (cold_want > self._cold) - (cold_want < self._cold)
        if direction == 0:
            self._wish_since = None
        elif self._wish_since is None or self._wish_since[0] != direction:
            self._wish_since = (direction, now_s)
        if direction and now_s - self._wish_since[1] >= (
            self._up_s if direction > 0 else self._down_s
        ):
            self._cold, self._wish_since = cold_want, None
        return Targets(self._cold, f"ongoing-based desire {desired}", forecast_rps=load)


class KnativeController:
    def __init__(
        self,
        name: str,
        capacity_rps: float,
        utilization: float,
        mean_e2e_s: float,
        stable_s: float = 60.0,
        panic_s: float = 6.0,
        panic_threshold: float = 2.0,
        max_replicas: int = 10**6,
    ) -> None:
        self.name, self.hot_replicas = name, 1
        self._cap, self._u, self._e2e, self._max = (
            capacity_rps,
            utilization,
            mean_e2e_s,
            max_replicas,
        )
        self._stable, self._panic = _Window(stable_s), _Window(panic_s)
        self._stable_s, self._threshold = stable_s, panic_threshold
        self._rate = 0.0
        self._total, self._primed = 1, False
        self._panic_until = -math.inf

    def tick(self, now_s: float, obs: Observation) -> Targets:
        if obs.rate_rps is not None:
            self._rate = obs.rate_rps
        load = self._rate + obs.queue_depth / self._e2e
        stable = replicas_for(self._stable.add(now_s, load), self._cap, self._u)
        panic = replicas_for(self._panic.add(now_s, load), self._cap, self._u)
        ready = obs.hot_ready + obs.cold_ready
        if panic >= self._threshold * max(ready, 1):
            self._panic_until = now_s + self._stable_s
        if not self._primed:  # start at the level of the trace
            self._total, self._primed = max(stable, 1), True
        if now_s < self._panic_until:
            want = max(self._total, panic, stable)  # never scale down while panicking
        else:
            want = max(stable, math.ceil(self._total / 2))  # max scale-down rate 2
        self._total = min(max(want, 1), self._max)
        return Targets(self._total - 1, "knative", now_s < self._panic_until, load)


def _most_ahead(need: np.ndarray, lookahead_s: int) -> np.ndarray:
    """ahead[i] = max need over [i, i + lookahead_s], by doubling: after each pass ahead[i]
    covers [i, i + span - 1]; O(n log lookahead)."""
    ahead, span = need.copy(), 1
    while span <= lookahead_s:
        step = min(span, lookahead_s + 1 - span)
        ahead[:-step] = np.maximum(ahead[:-step], ahead[step:])
        span += step
    return ahead


class OracleController:
    def __init__(
        self, name: str, arrivals: np.ndarray, t0_s: float, capacity_rps: float, lookahead_s: int
    ) -> None:
        self.name, self.hot_replicas = name, 0
        need = np.ceil(arrivals / capacity_rps - 1e-9)
        self._ahead, self._t0 = _most_ahead(need, lookahead_s), t0_s

    def tick(self, now_s: float, obs: Observation) -> Targets:
        i = min(int(now_s - self._t0), len(self._ahead) - 1)
        n = int(self._ahead[i])
        return Targets(n, self.name, forecast_rps=float(n))


class RateOracleController(OracleController):
    """Knows the rate curve the arrivals are drawn from (every future second's mean, not the
    draws): at t it holds the replicas that the highest rate of [t, t + lookahead_s] needs with
    the queue margin of `queue_tail_share` (policy.queue_margin_rps), the knob swept. The best
    any forecast of the rate could do with that margin: what it misses is the arrivals'
    randomness around a perfectly known rate."""

    def __init__(
        self,
        name: str,
        rate_s: np.ndarray,
        t0_s: float,
        capacity_rps: float,
        lookahead_s: int,
        cfg: PolicyConfig,
    ) -> None:
        self.name, self.hot_replicas = name, 0
        margin = np.vectorize(lambda r: queue_margin_rps(float(r), cfg))(rate_s)
        need = np.ceil((rate_s + margin) / capacity_rps - 1e-9)
        self._ahead, self._t0 = _most_ahead(need, lookahead_s), t0_s
