"""The bounded front door: how many requests the ingress holds, how many may wait for it in the
HTTP proxy, and what Serve answers beyond that. Derived from the config, not constants.

    max_ongoing_requests  a full batch running and one waiting on every replica that may run:
                          (hot replicas + cold max_replicas) x min(replica.max_ongoing_requests,
                          2 x engine.max_num_seqs). The ingress only relays, and a request
                          behind two batches would wait a whole request's time at least, past
                          any TTFT budget that admitted the second; it waits better in the
                          proxy's bounded queue: every request the ingress holds costs its event
                          loop, which on shared cores delays the relay of every admitted stream
                          (docs/serving.md)
    lower_tier_slots      of those, what analytical and offline requests may hold together:
                          half (serving/llm/tier_share.py), so a flood of them never leaves
                          interactive requests to the proxy's tier-blind queue
    max_queued_requests   what may wait in the proxy for an ingress slot: slots free at least as
                          fast as the hot replicas complete requests (the cold pool may be at
                          zero), hot replicas x controller.replica_capacity_rps, and a request
                          that waited longer than the tightest tier's admission budget
                          (ttft_p99_s x ttft_admit_fraction) could no longer meet its SLO, a
                          wait no replica sees (it is spent before the ingress):
                          floor(capacity_rps x budget_s); and at least the sequences the hot
                          replicas can start at once (hot replicas x engine.max_num_seqs):
                          Serve counts a request as queued until its router has picked a
                          replica, so a burst of clients arriving together (16 streams opened
                          at once on the default job) waits there for the router's probe of the
                          ingress even with every slot free, and must not be refused for it
    retry_after_s         Retry-After of Serve's own 429 past that queue: the time a full queue
                          takes to drain at that capacity, bounded like the replicas' Retry-After

Beyond the queue, Serve's backpressure (BackpressureConfig, status 429) answers in the proxy,
before the request reaches the ingress. `server.ingress_max_ongoing_requests` and
`server.ingress_max_queued_requests` override the derived numbers when set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.config import AppConfig

RETRY_AFTER_MIN_S = 1.0  # Retry-After is whole seconds (serving/llm/admission.py, same floor)


@dataclass(frozen=True, slots=True)
class FrontDoor:
    max_ongoing_requests: int
    max_queued_requests: int
    retry_after_s: float
    lower_tier_slots: int


def front_door(cfg: AppConfig) -> FrontDoor:
    pools, server = cfg.pools, cfg.server
    num_replicas = pools.hot.num_replicas + pools.cold.max_replicas
    capacity_rps = pools.hot.num_replicas * cfg.controller.replica_capacity_rps
    budget_s = min(t.ttft_p99_s * t.ttft_admit_fraction for t in cfg.tiers.values())
    max_ongoing = server.ingress_max_ongoing_requests
    if max_ongoing is None:
        per_replica = min(cfg.replica.max_ongoing_requests, 2 * cfg.engine.max_num_seqs)
        max_ongoing = num_replicas * per_replica
    max_queued = server.ingress_max_queued_requests
    if max_queued is None:
        burst = pools.hot.num_replicas * cfg.engine.max_num_seqs
        max_queued = max(1, math.floor(capacity_rps * budget_s), burst)
    drain_s = max_queued / capacity_rps
    retry_s = min(max(drain_s, RETRY_AFTER_MIN_S), server.retry_after_max_s)
    return FrontDoor(max_ongoing, max_queued, retry_s, max(1, max_ongoing // 2))
