"""The replica service model of the replay: capacity and TTFT against load (pure, numpy).

Fluid model, one value per simulated second:
    capacity_rps(s) = ready replicas x replica_capacity_rps
    queue(s)        = max(0, queue(s-1) + arrivals(s) - capacity(s))    (Lindley recursion)
    wait(s)         = queue(s) / capacity(s)                            (FIFO: the backlog ahead)
    ttft(s)         = ttft_idle_s + (ttft_full_s - ttft_idle_s) x utilisation(s) + wait(s)

All requests arriving in one second share that second's TTFT.

`admit_ttft_s` None keeps the queue unbounded (Ray Serve's default: max_queued_requests -1), so
a shortfall that lasts makes every later request wait. A number is tideserve's serving path: a
replica refuses (429) a request whose TTFT would pass it (serving/llm/admission.py), so the
queue never holds more than that TTFT allows; the refused requests count as SLO violations:
    queue(s)   = min(max(0, queue(s-1) + arrivals(s) - capacity(s)), q_max(s))
    q_max(s)   = (admit_ttft_s - ttft without wait(s)) x capacity(s)
    refused(s) = what the min cut off
(the replica predicts with its measured step time, here exactly: the model's admission is the
ideal one, with no share of the SLO kept back for prediction error). With a capacity profile
(capacity/calibrate.py) the numbers come from the measured step-time model at the engine's
max concurrency; otherwise from cluster.yaml's controller.replica_capacity_rps and the documented
defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.validate import check_order, check_range


@dataclass(frozen=True)
class ServiceModel:
    _owner = "ServiceModel"

    replica_capacity_rps: float
    ttft_idle_s: float = 0.2  # prefill of a lone request
    ttft_full_s: float = 0.5  # prefill squeezed between full-batch decode steps
    mean_e2e_s: float = 10.0  # request duration (Little's law: ongoing = rate x e2e)
    source: str = "simple"  # "simple" or the profile it came from
    admit_ttft_s: float | None = None  # refuse what would wait past this TTFT; None: FIFO

    def __post_init__(self) -> None:
        o = self._owner
        if self.admit_ttft_s is not None:
            check_range(o, "admit_ttft_s", self.admit_ttft_s, self.ttft_full_s, None)
        check_range(o, "replica_capacity_rps", self.replica_capacity_rps, 0.0, None, lo_open=True)
        check_range(o, "ttft_idle_s", self.ttft_idle_s, 0.0, None)
        check_range(o, "mean_e2e_s", self.mean_e2e_s, 0.0, None, lo_open=True)
        check_order(o, ("ttft_idle_s", self.ttft_idle_s), ("ttft_full_s", self.ttft_full_s))

    @classmethod
    def from_profile(
        cls, profile, concurrency: int, avg_input_tokens: float, avg_output_tokens: float
    ) -> ServiceModel:
        """From a capacity.calibrate.Profile at the engine's concurrency and mean token counts."""
        from capacity.planner import throughput_from_profile

        _, rps, step_s = throughput_from_profile(
            profile, concurrency, avg_input_tokens, avg_output_tokens
        )
        ctx = avg_input_tokens + avg_output_tokens / 2
        idle = profile.predict_step_s(avg_input_tokens, avg_input_tokens)
        full = profile.predict_step_s(
            concurrency + avg_input_tokens, concurrency * ctx + avg_input_tokens
        )
        return cls(
            replica_capacity_rps=rps,
            ttft_idle_s=float(idle),
            ttft_full_s=float(max(full, idle)),
            mean_e2e_s=float(step_s * avg_output_tokens),
            source=f"capacity profile ({profile.device}, concurrency {concurrency})",
        )

    def describe(self) -> str:
        queue = "FIFO queue wait (unbounded)"
        if self.admit_ttft_s is not None:
            queue = f"queue wait, refusing (429) what would pass {self.admit_ttft_s:.3g} s TTFT"
        return (
            f"per-second fluid queue; replica capacity {self.replica_capacity_rps:.3g} rps, "
            f"TTFT {self.ttft_idle_s:.3g} s idle to {self.ttft_full_s:.3g} s at full load plus "
            f"{queue}; source: {self.source}"
        )

    def queue(
        self, arrivals: np.ndarray, ready: np.ndarray, q0: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Queue after each second, each second's TTFT (of its admitted requests) and the
        requests refused in it, for arrivals and ready replicas."""
        cap = ready * self.replica_capacity_rps
        net = np.cumsum(arrivals - cap)
        # Lindley: Q_t = max(q0 + S_t, S_t - min_{s<=t} S_s), S = running sum of (a - c)
        q = np.maximum(q0 + net, net - np.minimum.accumulate(np.minimum(net, 0.0)))
        q = np.maximum(q, 0.0)
        safe_cap = np.maximum(cap, 1e-9)
        util = np.minimum(arrivals / safe_cap, 1.0)
        no_wait_s = self.ttft_idle_s + (self.ttft_full_s - self.ttft_idle_s) * util
        refused = np.zeros(len(arrivals))
        if self.admit_ttft_s is not None:
            q_max = np.maximum(self.admit_ttft_s - no_wait_s, 0.0) * cap
            if (q > q_max).any():  # rare (an overload): the bounded recursion, second by second
                q = _bounded_queue(arrivals, cap, q_max, q0, refused)
        return q, no_wait_s + q / safe_cap, refused


def _bounded_queue(
    arrivals: np.ndarray, cap: np.ndarray, q_max: np.ndarray, q0: float, refused: np.ndarray
) -> np.ndarray:
    """Lindley's recursion capped at q_max; what the cap cuts off goes into `refused`."""
    q, prev = np.empty(len(arrivals)), q0
    for i, (a, c, top) in enumerate(
        zip(arrivals.tolist(), cap.tolist(), q_max.tolist(), strict=True)
    ):
        x = max(prev + a - c, 0.0)
        if x > top:
            refused[i], x = x - top, top
        q[i] = prev = x
    return q
