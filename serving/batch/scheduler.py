"""The offline lane's decisions, pure (no Ray, no clock: `now_s` is passed in).

decide_lane: how many batch requests may be in flight now, and how many running ones to cancel.
  Batch work takes only what live (interactive + analytical) traffic leaves: of the replicas'
  lower-tier request slots, those live requests do not hold, scaled down by the live arrival rate's
  share of the replicas' capacity, times `slot_share`. New batch requests start only while the
  busiest replica's KV use is under the engine's offline idle fraction and no replica refused
  offline work within `refusal_backoff_s`. When live traffic rises past what is left (more live
  requests in flight, or arriving faster), the newest batch requests are cancelled AT ONCE: their
  KV returns to live traffic, their lines go back to pending (never answered, so never twice).

plan_cold_start: whether a batch whose deadline the forecast valleys cannot meet may start the
  cold pool. The valleys' capacity is projected bin by bin from the forecast; the cold pool is
  advised only when that falls short AND the forecast rate now is off-peak (never at peak: at
  peak the cold pool is the live traffic's, and the forecast controller owns it).

estimate_completion: when the remaining tokens will be done at the valleys' projected pace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaneView:
    now_s: float
    num_replicas: int  # running replicas the lane may send to (hot + cold while available)
    slots_per_replica: int  # requests one replica holds for lower tiers (admission's limit)
    live_in_flight: int  # interactive + analytical requests the replicas hold now
    live_rate_rps: float  # live arrivals per second over the last poll interval
    replica_capacity_rps: float  # live requests/s one replica sustains in its SLO
    batch_in_flight: int
    kv_use_fraction: float  # the busiest replica's
    offline_idle_fraction: float  # engine.offline_idle_fraction
    last_refusal_s: float | None  # when a replica last refused a batch request


@dataclass(frozen=True, slots=True)
class LaneDecision:
    max_in_flight: int  # batch requests that may be in flight after this decision
    num_to_cancel: int  # running batch requests to cancel now (live traffic took the room)
    reason: str
    # New batch requests may start until the next decision: the runner then refills a slot as
    # soon as a batch request ends, not a poll later (a short request would leave its slot idle
    # for most of each poll interval).
    may_start: bool = False


def live_room(view: LaneView, slot_share: float, max_in_flight: int) -> int:
    """Batch requests the replicas have room for beside the live traffic."""
    slots = view.num_replicas * view.slots_per_replica
    free = slots - view.live_in_flight
    load = view.live_rate_rps / max(view.num_replicas * view.replica_capacity_rps, 1e-9)
    by_rate = slots * max(0.0, 1.0 - load)
    return max(0, min(max_in_flight, math.floor(slot_share * min(free, by_rate))))


def decide_lane(
    view: LaneView, slot_share: float, max_in_flight: int, refusal_backoff_s: float
) -> LaneDecision:
    if view.num_replicas <= 0:
        return LaneDecision(0, 0, "no running replica")
    room = live_room(view, slot_share, max_in_flight)
    cancel = max(0, view.batch_in_flight - room)
    if cancel:
        return LaneDecision(
            room, cancel, f"live traffic rose: room for {room} batch requests, {cancel} yield"
        )
    if view.kv_use_fraction >= view.offline_idle_fraction:
        return LaneDecision(
            view.batch_in_flight,
            0,
            f"KV use {view.kv_use_fraction:.0%} >= idle fraction "
            f"{view.offline_idle_fraction:.0%}: no new batch requests",
        )
    since = None if view.last_refusal_s is None else view.now_s - view.last_refusal_s
    if since is not None and since < refusal_backoff_s:
        return LaneDecision(
            view.batch_in_flight, 0, f"a replica refused offline work {since:.1f} s ago"
        )
    return LaneDecision(room, 0, f"idle capacity for {room} batch requests", may_start=True)


@dataclass(frozen=True, slots=True)
class ValleyModel:
    """How the forecast turns into batch capacity. A replica's batch throughput scales with the
    share of it live traffic leaves idle: idle = 1 - rate / (replicas x capacity)."""

    bin_s: float  # width of one forecast bin
    hot_replicas: int
    replica_capacity_rps: float
    batch_tokens_per_replica_s: float  # measured batch tokens/s of one otherwise idle replica
    offpeak_fraction: float = 0.5  # "off-peak": forecast rate <= this x the horizon's peak
    safety: float = 1.2  # the valleys must cover this multiple of the remaining tokens


def _idle_share(rate_rps: float, replicas: int, capacity_rps: float) -> float:
    return max(0.0, 1.0 - rate_rps / max(replicas * capacity_rps, 1e-9))


def valley_tokens(rates_rps: Sequence[float], model: ValleyModel) -> list[float]:
    """Batch tokens the hot pool's idle capacity yields in each forecast bin."""
    per_s = model.hot_replicas * model.batch_tokens_per_replica_s
    return [
        _idle_share(r, model.hot_replicas, model.replica_capacity_rps) * per_s * model.bin_s
        for r in rates_rps
    ]


def estimate_completion(
    now_s: float, remaining_tokens: float, rates_rps: Sequence[float], model: ValleyModel
) -> float | None:
    """The time the remaining tokens are done in the valleys; None: not within the forecast."""
    if remaining_tokens <= 0:
        return now_s
    done = 0.0
    for i, tokens in enumerate(valley_tokens(rates_rps, model)):
        if tokens > 0 and done + tokens >= remaining_tokens:
            return now_s + (i + (remaining_tokens - done) / tokens) * model.bin_s
        done += tokens
    return None


@dataclass(frozen=True, slots=True)
class ColdAdvice:
    start_cold: bool
    num_replicas: int
    reason: str


def plan_cold_start(
    now_s: float,
    deadline_s: float,
    remaining_tokens: float,
    rates_rps: Sequence[float],
    model: ValleyModel,
    max_cold_replicas: int,
) -> ColdAdvice:
    """`rates_rps[i]` is the forecast rate of the bin starting at now + i x bin_s."""
    num_bins = max(0, math.ceil((deadline_s - now_s) / model.bin_s))
    horizon = list(rates_rps[:num_bins])
    if not horizon:
        return ColdAdvice(False, 0, "no forecast before the deadline")
    valleys = sum(valley_tokens(horizon, model))
    need = remaining_tokens * model.safety
    if valleys >= need:
        return ColdAdvice(False, 0, f"valleys hold {valleys:.0f} of {need:.0f} tokens needed")
    peak = max(horizon)
    if horizon[0] > model.offpeak_fraction * peak:
        return ColdAdvice(
            False,
            0,
            f"short {need - valleys:.0f} tokens, but {horizon[0]:.2f} req/s is peak "
            f"(> {model.offpeak_fraction:.0%} of {peak:.2f}): the cold pool is live traffic's",
        )
    offpeak_s = model.bin_s * sum(1 for r in horizon if r <= model.offpeak_fraction * peak)
    per_replica = model.batch_tokens_per_replica_s * offpeak_s
    replicas = min(max_cold_replicas, math.ceil((need - valleys) / max(per_replica, 1e-9)))
    if replicas <= 0:
        return ColdAdvice(False, 0, "short of tokens, but no cold replica may start")
    return ColdAdvice(
        True,
        replicas,
        f"valleys hold {valleys:.0f} of {need:.0f} tokens; off-peak now: "
        f"{replicas} cold replica(s) for {offpeak_s:.0f} s of off-peak bins",
    )
