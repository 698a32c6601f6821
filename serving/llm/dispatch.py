"""Pool choice with failover, and what the ingress does with a replica's stream.

Pool order per tier (docs/design.md, "The path of one request"):
  interactive  hot first; cold when hot is saturated (its replica refuses or Serve backpressures)
  analytical   cold first, then hot
  offline      cold first, then hot; replicas admit offline work only with idle KV headroom
A pool with no running replica is skipped. When every eligible pool refuses: 429 + Retry-After.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from serving.api.errors import ApiError
from serving.llm.messages import Delta, Failure, GenerateRequest, ReplicaItem

log = logging.getLogger("ray.serve")

POOL_ORDER = {
    "interactive": ("hot", "cold"),
    "analytical": ("cold", "hot"),
    "offline": ("cold", "hot"),
}


@dataclass(slots=True)
class OpenStream:
    """A replica stream whose first item was a delta: admission succeeded."""

    first: Delta
    rest: AsyncIterator[ReplicaItem]
    pool: str
    response: object = None  # the DeploymentResponseGenerator, kept to cancel it

    def cancel(self) -> None:
        cancel = getattr(self.response, "cancel", None)
        if cancel is not None:
            cancel()


@dataclass(slots=True)
class Refusals:
    reasons: list[str] = field(default_factory=list)
    retry_after_s: float = 0.0

    def add(self, reason: str, retry_after_s: float) -> None:
        self.reasons.append(reason)
        self.retry_after_s = max(self.retry_after_s, retry_after_s)

    def error(self, default_retry_s: float) -> ApiError:
        if not self.reasons:
            return ApiError(
                503,
                "no replica is running for this request's pools",
                type_="service_unavailable",
                retry_after_s=default_retry_s,
            )
        return ApiError(
            429,
            "server is saturated: " + "; ".join(self.reasons),
            type_="rate_limit_error",
            code="rate_limit_exceeded",
            retry_after_s=self.retry_after_s or default_retry_s,
        )


class RefusalMemo:
    """Remembers for `hold_s` that a pool refused a lower tier (analytical, offline). A flood of
    such requests, which the pool would refuse again, is then answered at the ingress instead of
    costing a replica round trip each: on shared cores those round trips are what would slow the
    interactive requests (measured in tests/integration/test_overload.py). Interactive requests
    always ask the replicas."""

    def __init__(self, hold_s: float = 0.5) -> None:
        self.hold_s = hold_s
        self._until: dict[tuple[str, str], float] = {}

    def refused_recently(self, pool: str, tier: str, now: float) -> bool:
        return self._until.get((pool, tier), 0.0) > now

    def note(self, pool: str, tier: str, now: float) -> None:
        if tier != "interactive":
            self._until[(pool, tier)] = now + self.hold_s


async def open_stream(
    handles: dict,
    available: dict[str, bool],
    request: GenerateRequest,
    default_retry_s: float,
    memo: RefusalMemo | None = None,
    now: float = 0.0,
) -> OpenStream:
    """Try the tier's pools in order until one admits; raise ApiError 400/429/503 otherwise."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import BackPressureError

    refusals = Refusals()
    tier = request.tier
    for pool in POOL_ORDER[tier]:
        if not available.get(pool, False):
            continue
        if memo is not None and memo.refused_recently(pool, tier, now):
            refusals.add(f"{pool}: refused {tier} work within the last {memo.hold_s} s", 1.0)
            continue
        response = handles[pool].options(stream=True).generate_stream.remote(request)
        try:
            first = await response.__anext__()
        except BackPressureError as err:
            refusals.add(f"{pool}: replica queues full ({err})", default_retry_s)
            continue
        except RayError as err:  # the replica died before its first item: nothing was sent yet,
            # so the next pool may take the request; Serve replaces the dead replica meanwhile
            log.warning("%s replica failed before answering: %s", pool, type(err).__name__)
            refusals.add(f"{pool}: replica failed", default_retry_s)
            continue
        except StopAsyncIteration:
            refusals.add(f"{pool}: empty stream", default_retry_s)
            continue
        if isinstance(first, Delta):
            return OpenStream(first, response, pool, response)
        if isinstance(first, Failure):
            raise ApiError(first.status, first.message)
        refusals.add(first.reason, first.retry_after_s)
        if memo is not None:
            memo.note(pool, tier, now)
    raise refusals.error(default_retry_s)
