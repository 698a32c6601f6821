"""A reference for the frontier: tideserve's `decide()` told the true rate, with a fixed headroom.

No controller can run this. It shows how far knowing the present exactly gets a policy that
holds the same multiple of it at every hour:

* every tick it knows the mean rate of the trace window that the last interval fell in (the
  window's true mean, not a noisy reading of it; one interval late, as every controller sees a
  step only at the tick after it);
* `decide()` plans for that rate x a fixed `headroom` (the knob swept), with everything else
  the live policy has: the emergency path, the panic hold, the scale-down window.

It does not know the next window: a step up at a window edge finds the capacity the old rate
asked for, as it finds every policy here. With `ahead_s` (one tick plus one cold start: the
`next_window` reference) it is also told the next window's mean that long before its edge, and
plans for the higher of the two: the upper yardstick, which no step surprises.
So the gap between the present-rate reference and tideserve measures what the forecast and
the learned, volatility-grouped headroom buy over perfect knowledge of the present; and
reactive's violations over this reference's, at equal GPU-hours, show
what sizing a fixed multiple of the true present rate gains over reactive.
Pure: time comes in as `now_s`.
"""

from __future__ import annotations

import numpy as np

from autoscaling.forecast import Forecast
from autoscaling.policy import PolicyConfig, PolicyState, Snapshot, decide
from autoscaling.replay.sim import Observation, Targets


class PresentRateController:
    def __init__(
        self,
        cfg: PolicyConfig,
        arrivals: np.ndarray,
        t0_s: float,
        bin_s: int,
        headroom: float,
        interval_s: int,
        cold_start_s: float,
        name: str = "present_rate",
        ahead_s: float = 0.0,
    ) -> None:
        if headroom <= 0:
            raise ValueError(f"PresentRateController.headroom={headroom!r} must be > 0")
        if ahead_s < 0:
            raise ValueError(f"PresentRateController.ahead_s={ahead_s!r} must be >= 0")
        if bin_s < 1:
            raise ValueError(f"PresentRateController.bin_s={bin_s!r} must be >= 1")
        self.name, self.cfg, self.hot_replicas = name, cfg, cfg.hot_replicas
        self._t0, self._bin, self._interval = t0_s, bin_s, interval_s
        self._headroom, self._cold_start_s, self._ahead_s = headroom, cold_start_s, ahead_s
        if not len(arrivals):
            raise ValueError("PresentRateController.arrivals is empty: no window to know")
        # each window's mean, the last one however short the trace leaves it
        starts = np.arange(0, len(arrivals), bin_s)
        lengths = np.diff(np.r_[starts, len(arrivals)])
        self._means = np.add.reduceat(arrivals, starts) / lengths
        self.state = PolicyState.initial()

    def _window_mean(self, second: int) -> float:
        return float(self._means[min(max(second, 0) // self._bin, len(self._means) - 1)])

    def true_rate_rps(self, now_s: float) -> float:
        """The true mean rate of the window the last interval ([now - interval, now)) fell in;
        with `ahead_s`, the higher of that and the mean of the window `ahead_s` from now (the
        next window's mean told that long before its edge)."""
        rate = self._window_mean(int(now_s - self._t0) - self._interval)
        if self._ahead_s:
            rate = max(rate, self._window_mean(int(now_s - self._t0 + self._ahead_s)))
        return rate

    def tick(self, now_s: float, obs: Observation) -> Targets:
        rate = self.true_rate_rps(now_s)
        fc = Forecast(rate, rate, "the window's true rate (hindsight)", rate)
        snap = Snapshot(
            hot_replicas=obs.hot_ready,
            cold_ready=obs.cold_ready,
            cold_starting=obs.cold_starting,
            rate_rps=rate,
            queue_depth=int(obs.queue_depth),
            queue_wait_s=obs.queue_wait_s,
            forecast=fc,
            refused_rps=obs.refused_rps,
            cold_start_p95_s=self._cold_start_s,
            headroom=self._headroom,
            headroom_basis=f"fixed {self._headroom:g}",
        )
        decision, self.state = decide(snap, self.state, self.cfg, now_s)
        planned = decision.details["planned_rps"]
        return Targets(decision.cold_target, decision.reason, decision.emergency, planned)
