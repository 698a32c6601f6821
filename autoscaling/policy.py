"""The hot/cold scaling policy: `decide(snapshot, state, cfg, now_s) -> (Decision, state)` (pure).

The hot pool is constant (R5/R9). The cold pool follows the forecast:

    base     = max(forecast peak over [now, now + lead + horizon], rate seen now (the mean over
                   `rate_window_s`), the recent trend: the observed rates' line over
                   `trend_window_s`, read at now + lead when it rises; a ramp the profile did
                   not foresee)
    planned  = max(base x headroom, base + queue margin)
    needed   = ceil(planned / capacity)
    capacity = replica_capacity_rps, derated by adapter slot loads: 1 / (1/c + m), m the
               measured load seconds per request (a step waits while an adapter is written)
    headroom = learned online (autoscaling/headroom.py): an upper quantile of the forecast's own
               recent errors x the SLO's feedback; 1 / target_utilization (R6's safety factor)
               until it has scores
    margin   = what Poisson arrivals at the base need so that the queue passes the emergency's
               wait only `queue_tail_share` of the time (queue_margin_rps); the headroom covers
               the forecast's error, the margin the randomness around a right forecast
    cold     = clamp(needed - hot, min_cold, max_cold)
    lead     = window override, else measured p95 cold start + margin, else cfg.lead_s

* Scale-up is immediate: a forecast that needs more replicas gets them now.
* Emergency (Knative's panic mode): when the queue wait or the queue depth passes half the TTFT
  SLO (depth measured in seconds of pool capacity), or more than `panic_refused_share` of the
  requests were refused for capacity (429: the replicas' admission sheds what would miss the
  SLO, so their queues stay short), scale up at once to what the observed rate plus draining
  the queue needs (at least one replica more than are ready; those still starting count
  towards it), and hold off any scale-down for `panic_hold_s`.
* The batch lane's ask (`offline_cold_replicas`) is a floor on the cold target, within bounds.
* Scale-down is the max recommendation over the last `stabilization_window_s` (the Kubernetes HPA
  rule), so a dip must last a whole window before replicas go; the controller then drains them.
* Scale-down band: a replica goes only if the pool left behind still meets the plan at the
  stricter `scale_down_tail_share` (the queue margin of that tail). Taking one away is at once,
  putting it back a cold start; a rate that sits at a replica boundary would otherwise flap,
  and every flap leaves the pool one replica short for a cold start (the HPA's 10% tolerance,
  sized by the queue's tail instead of a fixed share).

Every decision carries a one-line reason. State holds only recent recommendations and the panic
deadline; time always comes in as `now_s`, so tests step time by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaling.forecast import Forecast
from autoscaling.policy_config import PolicyConfig

__all__ = [
    "Decision",
    "PolicyConfig",
    "PolicyState",
    "Snapshot",
    "decide",
    "effective_capacity_rps",
    "in_distress",
    "lead_s_for",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the controller saw at one tick."""

    hot_replicas: int  # hot replicas up (ready)
    cold_ready: int
    cold_starting: int  # requested, not yet ready
    rate_rps: float  # observed arrival rate over the last interval
    queue_depth: int  # requests waiting for a slot, all replicas together
    queue_wait_s: float  # oldest (or p99) queue wait right now
    forecast: Forecast
    # of rate_rps, the requests refused for capacity (429) over the same interval
    refused_rps: float = 0.0
    cold_start_p95_s: float | None = None  # measured; None until a cold start was seen
    lead_s: float | None = None  # per-time-window override in force (cluster.yaml), if any
    # learned multiplier on the forecast (autoscaling/headroom.py); None: not learned yet, plan at
    # R6's safety factor 1 / target_utilization instead
    headroom: float | None = None
    headroom_basis: str = "prior 1/target_utilization"
    # cold replicas the batch lane asks for now (serving/batch/lane.py); a floor on the target
    offline_cold_replicas: int = 0
    # engine seconds of LoRA slot loads per admitted request, over the replicas' last windows
    adapter_miss_s_per_request: float = 0.0
    # the observed rates' recent line at now + lead when rising (cfg.trend_window_s); None: off
    trend_rps: float | None = None
    # the rate's mean over cfg.rate_window_s, the plan's "rate seen now" (None: this tick's rate)
    recent_rate_rps: float | None = None

    @property
    def cold_current(self) -> int:
        return self.cold_ready + self.cold_starting


@dataclass(frozen=True, slots=True)
class PolicyState:
    # (time, recommended cold replicas) over the last stabilisation window, oldest first
    recent: tuple[tuple[float, int], ...] = ()
    panic_until_s: float = -math.inf
    cold_target: int | None = None  # last target set (None: not yet decided)

    @classmethod
    def initial(cls) -> PolicyState:
        return cls()

    def to_dict(self) -> dict[str, Any]:
        return {
            "recent": [list(x) for x in self.recent],
            "panic_until_s": None if math.isinf(self.panic_until_s) else self.panic_until_s,
            "cold_target": self.cold_target,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicyState:
        panic = d.get("panic_until_s")
        return cls(
            recent=tuple((float(t), int(n)) for t, n in d.get("recent", ())),
            panic_until_s=-math.inf if panic is None else float(panic),
            cold_target=d.get("cold_target"),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    hot_target: int
    cold_target: int
    reason: str
    emergency: bool = False
    lead_s: float = 0.0  # the lead the decision planned for
    needed_replicas: int = 0  # total replicas the forecast (or the emergency) asked for
    details: dict[str, float] = field(default_factory=dict)


def lead_s_for(
    cfg: PolicyConfig, cold_start_p95_s: float | None, override_s: float | None
) -> float:
    """How far ahead to look: the window override, else measured p95 cold start + margin."""
    if override_s is not None:
        return float(override_s)
    if cold_start_p95_s is not None:
        return float(cold_start_p95_s) + cfg.cold_start_margin_s
    return cfg.lead_s


def effective_capacity_rps(capacity_rps: float, miss_s_per_request: float) -> float:
    """Requests/s one replica serves when each request also costs `miss_s_per_request` seconds
    of adapter slot loads, during which the step (every running request) waits.

    In one second the replica spends x * m seconds loading and serves at rate c in the rest:
    x = c * (1 - x * m), so x = c / (1 + c * m) = 1 / (1/c + m)."""
    return capacity_rps / (1.0 + capacity_rps * max(miss_s_per_request, 0.0))


def queue_margin_rps(rate_rps: float, cfg: PolicyConfig, tail_share: float | None = None) -> float:
    """Capacity to keep above a rightly forecast rate for its arrivals' randomness.

    A pool serving C requests/s to Poisson arrivals at rate r < C queues like a random walk with
    drift r - C and variance r per second; its queue passes x with probability about
    exp(-2 (C - r) x / r) (the heavy-traffic tail, Kingman). A wait past w (panic_queue_fraction
    x ttft_slo_s, where the emergency starts) is a queue past w C, so holding it to a share e
    (`queue_tail_share`) of the time needs (C - r) C = r ln(1 / e) / (2 w): about 3 requests/s at
    e = 0.05 and w = 0.5 s for any rate above a few dozen per second (0.7 at the default 0.5,
    where the scale-down band's stricter tail keeps the pool from flapping), less below, 0 at 0. The
    forecast's own error is the headroom's job; without this margin a headroom learned on
    30 s means plans calm hours at 100% of capacity, where the queue of an exactly forecast rate
    grows without bound. `tail_share` replaces `queue_tail_share` (the scale-down band's)."""
    share = cfg.queue_tail_share if tail_share is None else tail_share
    if share <= 0 or rate_rps <= 0:
        return 0.0
    k = math.log(1.0 / share) / (2.0 * cfg.panic_queue_fraction * cfg.ttft_slo_s)
    half = rate_rps / 2.0
    return half + math.sqrt(half * half + rate_rps * k) - rate_rps


def _replicas_for(rate_rps: float, cfg: PolicyConfig, capacity_rps: float) -> int:
    per_replica = capacity_rps * cfg.target_utilization
    return math.ceil(max(rate_rps, 0.0) / per_replica - 1e-9)


def in_distress(
    queue_wait_s: float,
    queue_depth: float,
    ready: int,
    cfg: PolicyConfig,
    refused_rps: float = 0.0,
    rate_rps: float = 0.0,
    miss_s_per_request: float = 0.0,
) -> bool:
    """The emergency test: the queue wait, or its depth in seconds of the ready replicas'
    capacity (derated by adapter loads), past `panic_queue_fraction` of the TTFT SLO (its
    requests miss the SLO); or more than `panic_refused_share` of the requests (`rate_rps`
    counts them all) refused for capacity."""
    capacity_rps = effective_capacity_rps(cfg.replica_capacity_rps, miss_s_per_request)
    depth_s = queue_depth / (max(ready, 1) * capacity_rps)
    limit_s = cfg.panic_queue_fraction * cfg.ttft_slo_s
    return queue_wait_s > limit_s or depth_s > limit_s or _refusing(refused_rps, rate_rps, cfg)


def _refusing(refused_rps: float, rate_rps: float, cfg: PolicyConfig) -> bool:
    return refused_rps > 0 and refused_rps > cfg.panic_refused_share * rate_rps


def _emergency_need(snap: Snapshot, cfg: PolicyConfig) -> tuple[int, str] | None:
    """Replicas the observed load needs right now when the queue passes half the SLO, else None."""
    ready = snap.hot_replicas + snap.cold_ready
    miss_s = snap.adapter_miss_s_per_request
    if not in_distress(
        snap.queue_wait_s, snap.queue_depth, ready, cfg, snap.refused_rps, snap.rate_rps, miss_s
    ):
        return None
    per_replica_rps = effective_capacity_rps(cfg.replica_capacity_rps, miss_s)
    capacity_rps = max(ready, 1) * per_replica_rps
    depth_s = snap.queue_depth / capacity_rps  # queue in seconds of current capacity
    limit_s = cfg.panic_queue_fraction * cfg.ttft_slo_s
    if snap.queue_wait_s > limit_s:
        what = f"queue wait {snap.queue_wait_s:.2f} s > {limit_s:.2f} s (half the TTFT SLO)"
    elif depth_s > limit_s:
        what = f"queue depth {snap.queue_depth} ({depth_s:.2f} s of capacity) > {limit_s:.2f} s"
    else:
        share = snap.refused_rps / max(snap.rate_rps, 1e-9)
        what = f"{100 * share:.0f}% of requests refused for capacity (429)"
    # Serve the observed rate and drain, within panic_drain_s, the backlog plus what will pile up
    # until the new replicas are ready (one cold start at the current shortfall). While the
    # replicas refuse, the shortfall is turned away (429) instead of piling up: nothing to drain.
    cold_start_s = snap.cold_start_p95_s if snap.cold_start_p95_s is not None else cfg.lead_s
    shortfall_rps = max(snap.rate_rps - capacity_rps, 0.0)
    piling_rps = 0.0 if snap.refused_rps > 0 else shortfall_rps
    backlog = snap.queue_depth + piling_rps * cold_start_s
    rate = snap.rate_rps + backlog / cfg.panic_drain_s
    # At least one replica more than serve now. Replicas still starting count towards the need:
    # they were asked for a cold start ago and arrive together, so a distress that lasts the cold
    # start adds what its growing backlog asks for, not one more replica every tick (that took
    # one replay's emergency from the 13 it needed to 28). With nothing starting, ready is all
    # that is held, and the floor is one more than that.
    need = max(_replicas_for(rate, cfg, per_replica_rps), ready + 1)
    return need, what


def _slow_scale_down(
    want: int,
    current: int,
    recent: tuple[tuple[float, int], ...],
    panic_until_s: float,
    snap: Snapshot,
    cfg: PolicyConfig,
    now_s: float,
) -> tuple[int, str]:
    """The cold target after the scale-down guards, and why it was held (scale-up passes)."""
    if want >= current:
        return want, ""
    target, why = want, ""
    held = max(n for _, n in recent)  # the HPA rule: max recommendation in the window
    if now_s < panic_until_s:
        target = current
        why = f"; hold {current} cold (panic hold until {panic_until_s - now_s:.0f} s)"
    elif held > want:
        target = min(held, current)
        why = f"; scale-down to {want} waits for the {cfg.stabilization_window_s:.0f} s window"
    warming = snap.cold_ready + snap.cold_starting
    if snap.cold_starting and target < min(warming, current):
        # A replica still starting was asked for by an earlier forecast; cancelling it wastes
        # its launch (a whole node, on an autoscaled cluster) and flaps when the forecast dips
        # for one tick before a ramp. Let it finish; the window decides once it is ready.
        target = min(warming, current)
        why += f"; keeps {snap.cold_starting} cold replica(s) that are still starting"
    return target, why


def _scale_down_band(
    want: int, current: int, details: dict[str, float], cfg: PolicyConfig
) -> tuple[int, str]:
    """The cold target a scale-down may go to: no lower than leaves the plan's base its margin
    at `scale_down_tail_share` (the band between the two tails holds what is there)."""
    if want >= current or cfg.scale_down_tail_share <= 0:
        return want, ""
    keep = min(max(int(details["band_replicas"]) - cfg.hot_replicas, want), current)
    if keep == want:
        return want, ""
    share = cfg.scale_down_tail_share
    return keep, (
        f"; keeps {keep} cold ({want} would queue past half the SLO over {share:g} of the time)"
    )


def _plan(snap: Snapshot, cfg: PolicyConfig, lead_s: float) -> tuple[int, dict[str, float], str]:
    """Replicas the forecast plan needs, the figures behind it, and why."""
    fc = snap.forecast
    headroom = 1.0 / cfg.target_utilization if snap.headroom is None else snap.headroom
    # the plan's base: the forecast peak, and never below the rate seen this tick (a step up the
    # level window has not caught yet); the headroom learned for this base multiplies it
    seen_rps = snap.rate_rps if snap.recent_rate_rps is None else snap.recent_rate_rps
    base_rps = max(fc.peak_rps, seen_rps, snap.trend_rps or 0.0)
    # the larger of the two risks: the forecast's error (the headroom) or, when the forecast is
    # right, the arrivals' randomness around it (the queue margin)
    margin_rps = queue_margin_rps(base_rps, cfg)
    planned_rps = base_rps * headroom
    by_margin = cfg.queue_tail_share > 0 and base_rps + margin_rps > planned_rps
    if by_margin:
        planned_rps = base_rps + margin_rps
    capacity_rps = effective_capacity_rps(cfg.replica_capacity_rps, snap.adapter_miss_s_per_request)
    needed = math.ceil(planned_rps / capacity_rps - 1e-9)
    why = (
        f"forecast peak {fc.peak_rps:.0f} rps x headroom {headroom:.2f} within "
        f"{lead_s:.0f}+{cfg.horizon_s:.0f} s ({fc.basis}; headroom {snap.headroom_basis}) "
        f"needs {needed} replicas"
    )
    if by_margin:
        why += f" (queue margin +{margin_rps:.1f} rps: the headroom is below it)"
    if snap.trend_rps is not None and snap.trend_rps > max(fc.peak_rps, snap.rate_rps):
        why += f" (the recent trend {snap.trend_rps:.0f} rps is above the forecast)"
    if capacity_rps < cfg.replica_capacity_rps:
        why += (
            f" at {capacity_rps:.3g} rps each (adapter slot loads "
            f"{1000 * snap.adapter_miss_s_per_request:.0f} ms/request derate "
            f"{cfg.replica_capacity_rps:.3g})"
        )
    # what a scale-down must leave: the same plan at the band's stricter tail
    band_margin_rps = queue_margin_rps(base_rps, cfg, cfg.scale_down_tail_share)
    band_rps = max(planned_rps, base_rps + band_margin_rps)
    details = {
        "planned_rps": planned_rps,
        "base_rps": base_rps,
        "headroom": headroom,
        "capacity_rps": capacity_rps,
        "band_replicas": float(math.ceil(band_rps / capacity_rps - 1e-9)),
    }
    return needed, details, why


def decide(
    snap: Snapshot, state: PolicyState, cfg: PolicyConfig, now_s: float
) -> tuple[Decision, PolicyState]:
    hot = cfg.hot_replicas
    lead = lead_s_for(cfg, snap.cold_start_p95_s, snap.lead_s)
    needed, details, why = _plan(snap, cfg, lead)
    want = min(max(needed - hot, cfg.min_cold_replicas), cfg.max_cold_replicas)
    current = snap.cold_current if state.cold_target is None else state.cold_target
    want, band_why = _scale_down_band(want, current, details, cfg)
    why += band_why
    emergency = _emergency_need(snap, cfg)
    panic_until = state.panic_until_s
    if emergency is not None:
        need, what = emergency
        want = min(max(want, need - hot), cfg.max_cold_replicas)
        panic_until = now_s + cfg.panic_hold_s
        why = f"EMERGENCY {what}; observed {snap.rate_rps:.0f} rps needs {need} replicas"
    window_start = now_s - cfg.stabilization_window_s
    recent = (*(x for x in state.recent if x[0] > window_start), (now_s, want))
    target, held_why = _slow_scale_down(want, current, recent, panic_until, snap, cfg, now_s)
    why += held_why
    target = min(max(target, cfg.min_cold_replicas), cfg.max_cold_replicas)
    if snap.offline_cold_replicas > target:  # the batch lane's ask, within the pool's bounds
        target = min(snap.offline_cold_replicas, cfg.max_cold_replicas)
        why += f"; the batch lane asks for {snap.offline_cold_replicas} cold"
    arrow = f"cold {current}->{target}" if target != current else f"cold stays {target}"
    decision = Decision(
        hot_target=hot,
        cold_target=target,
        reason=f"{arrow}: {why}",
        emergency=emergency is not None,
        lead_s=lead,
        needed_replicas=needed if emergency is None else emergency[0],
        details=details,
    )
    new_state = replace(state, recent=recent, panic_until_s=panic_until, cold_target=target)
    return decision, new_state
