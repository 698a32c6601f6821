"""Pool choice with failover, and what the ingress does with a replica's stream.

Pool order per tier (docs/design.md, "The path of one request"):
  interactive  hot first; cold when hot is saturated (its replica refuses or Serve backpressures)
  analytical   cold first, then hot
  offline      cold first, then hot; replicas admit offline work only with idle KV headroom
A pool with no running replica is skipped. When every eligible pool refuses: 429 + Retry-After.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from serving.api.errors import ApiError
from serving.engine.load import LoadSnapshot
from serving.llm.admission import RETRY_AFTER_MIN_S, Admission, judge_ttft, ttft_budget_s
from serving.llm.messages import Delta, Failure, GenerateRequest, Refusal, ReplicaItem
from serving.llm.ttft import predict_ttft
from serving.llm.ttft_margin import TtftMargins

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
    """Why each pool refused. Retry-After is the earliest any of them predicted capacity to
    free: the retry may go to whichever pool frees first."""

    reasons: list[str] = field(default_factory=list)
    retry_after_s: float = 0.0

    def add(self, reason: str, retry_after_s: float) -> None:
        first = not self.reasons
        self.reasons.append(reason)
        self.retry_after_s = retry_after_s if first else min(self.retry_after_s, retry_after_s)

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
    """What the pools' last refusals say, so that requests the pool would refuse again are
    answered at the ingress instead of costing a replica round trip each (on shared cores those
    round trips are what would slow the admitted requests; measured in
    tests/integration/test_overload.py).

    - TTFT (every tier): the refusing replica's load snapshot, re-stamped with this process's
      clock, is judged by the replica's own rule (serving/llm/admission.py `judge_ttft`) with
      time moving on: the pool is skipped until capacity is predicted to free, for at most
      `snapshot_hold_s` (another replica of the pool may have room; Serve's routing stats are
      as old).
    - count limits (lower tiers only): a pool that refused analytical or offline work is not
      asked again for that tier for `hold_s`. Interactive requests are judged by TTFT alone.
    An admitted request clears its pool's snapshot: the pool had room after all."""

    def __init__(
        self,
        slos: Mapping[str, tuple[float, float]] | None = None,
        retry_after_max_s: float = 60.0,
        hold_s: float = 0.5,
        snapshot_hold_s: float = 2.0,
    ) -> None:
        self.slos = dict(slos or {})  # tier -> (ttft_p99_s, ttft_admit_fraction)
        self.retry_after_max_s = retry_after_max_s
        self.hold_s = hold_s
        self.snapshot_hold_s = snapshot_hold_s
        self._until: dict[tuple[str, str], float] = {}
        self._loads: dict[str, tuple[LoadSnapshot, float]] = {}

    def refused_recently(self, pool: str, tier: str, now: float) -> bool:
        return self._until.get((pool, tier), 0.0) > now

    def predicted_refusal(
        self, pool: str, request: GenerateRequest, now: float
    ) -> Admission | None:
        """The replica rule applied to the pool's last snapshot; None: ask the replica."""
        entry, tier = self._loads.get(pool), request.tier
        if entry is None or tier not in self.slos or entry[1] <= now:
            return None
        prediction = predict_ttft(entry[0], tier, len(request.prompt_token_ids), now)
        slo_s, fraction = self.slos[tier]  # the budget as the replica counts it
        budget_s = ttft_budget_s(slo_s, fraction, request.spent_s, request.ttft_margin_s)
        decision = judge_ttft(
            prediction, tier, budget_s, self.retry_after_max_s, request.max_wait_s
        )
        return None if decision.admitted else decision

    def note(self, pool: str, refusal: Refusal, now: float) -> None:
        tier = refusal.tier
        if tier and tier != "interactive":
            self._until[(pool, tier)] = now + self.hold_s
        if refusal.load is not None:
            restamped = dataclasses.replace(refusal.load, taken_s=now)
            self._loads[pool] = (restamped, now + self.snapshot_hold_s)

    def admitted(self, pool: str) -> None:
        self._loads.pop(pool, None)


def _memo_refusal(memo: RefusalMemo | None, pool: str, request: GenerateRequest, now: float):
    """(reason, retry_after_s) when the memo answers for `pool`, else None."""
    if memo is None:
        return None
    tier = request.tier
    if memo.refused_recently(pool, tier, now):
        return f"{pool}: refused {tier} work within the last {memo.hold_s} s", RETRY_AFTER_MIN_S
    predicted = memo.predicted_refusal(pool, request, now)
    if predicted is not None:
        return f"{pool}: {predicted.reason} (last refusal's load)", predicted.retry_after_s
    return None


class PoolGone(Exception):
    """The pool lost its last running replica while a request waited for its first item."""


POOL_GONE_CHECK_S = 0.5  # how often a request waiting on an elastic pool checks it still exists


async def _first_item(response, pool: str, available: dict[str, bool]):
    """The stream's first item. For an elastic pool (not hot), give up when the pool stops
    being available (the ingress's watcher saw no running replica): the autoscaler removed its
    last replica, and Serve would park the request until a replica comes back, maybe hours
    later. Nothing reached the client yet, so the request goes on to the next pool."""
    if pool == "hot":
        return await response.__anext__()
    first = asyncio.ensure_future(response.__anext__())
    while True:
        done, _ = await asyncio.wait({first}, timeout=POOL_GONE_CHECK_S)
        if done:
            return first.result()
        if not available.get(pool, False):
            first.cancel()
            cancel = getattr(response, "cancel", None)
            if cancel is not None:
                cancel()
            raise PoolGone(pool)


async def open_stream(
    handles: dict,
    available: dict[str, bool],
    request: GenerateRequest,
    default_retry_s: float,
    memo: RefusalMemo | None = None,
    now: float = 0.0,
    margins: TtftMargins | None = None,
    sent_unix_s: float | None = None,
) -> OpenStream:
    """Try the tier's pools in order until one admits; raise ApiError 400/429/503 otherwise.
    Each pool gets the request with the TTFT margin the ingress measured for it and the wall
    clock of the first send (`sent_unix_s`), so a replica counts the time since."""
    from ray.exceptions import RayError
    from ray.serve.exceptions import BackPressureError

    refusals = Refusals()
    tier = request.tier
    if sent_unix_s is not None:
        request = dataclasses.replace(request, sent_unix_s=sent_unix_s)
    for pool in POOL_ORDER[tier]:
        if not available.get(pool, False):
            continue
        if margins is not None:
            request = dataclasses.replace(request, ttft_margin_s=margins.margin_s(pool, now))
        skipped = _memo_refusal(memo, pool, request, now)
        if skipped is not None:
            refusals.add(*skipped)
            continue
        response = handles[pool].options(stream=True).generate_stream.remote(request)
        try:
            first = await _first_item(response, pool, available)
        except PoolGone:
            refusals.add(f"{pool}: pool emptied before it answered", default_retry_s)
            continue
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
            if memo is not None:
                memo.admitted(pool)
            return OpenStream(first, response, pool, response)
        if isinstance(first, Failure):
            raise ApiError(first.status, first.message)
        refusals.add(first.reason, first.retry_after_s)
        if memo is not None:
            memo.note(pool, first, now)
    raise refusals.error(default_retry_s)
