"""The asyncio side of dynamic batching: a bounded queue and a loop that only awaits.

Every decision is `serving.embed.batching.next_batch` (what to send, or until when to wait)
and, once per tuner interval, `serving.embed.tuner.decide`. This loop owns the queue, the clock
and the executor: one batch runs at a time (a replica has one model), and requests keep
queueing while it runs. A full queue refuses at once (QueueFullError -> HTTP 429 with
Retry-After) instead of letting latency grow without bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from common.stats import percentile
from serving.config.dynamic_batching import DynamicBatchingSection
from serving.embed.batching import LANES, Batch, BatchPolicy, Waiting, next_batch, refusal_s
from serving.embed.tuner import (
    Observation,
    TunerConfig,
    TunerDecision,
    TunerState,
    decide,
    initial_state,
)

log = logging.getLogger("ray.serve")

RunBatch = Callable[[list[Any]], Awaitable[list[Any]]]


class QueueFullError(Exception):
    def __init__(self, num_waiting: int, retry_after_s: float) -> None:
        super().__init__(f"batch queue full ({num_waiting} waiting); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Item:
    view: Waiting
    payload: Any
    future: asyncio.Future


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One sent batch, for metrics and tests."""

    size: int
    lane: str
    bucket: int
    reason: str
    max_tokens: int
    run_s: float


class BatchLoop:
    """submit() from request handlers; the loop task starts with the first request."""

    def __init__(
        self,
        run_batch: RunBatch,
        config: DynamicBatchingSection,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_after_s: float = 1.0,
        on_batch: Callable[[BatchRecord], None] | None = None,
        on_tune: Callable[[TunerDecision], None] | None = None,
    ) -> None:
        self._run = run_batch
        self.config = config
        self.policy = BatchPolicy.of(config)
        self._clock = clock
        self.retry_after_s = retry_after_s
        self._on_batch = on_batch
        self._on_tune = on_tune
        self.tuner_cfg: TunerConfig | None = None
        self.tuner_state: TunerState | None = None
        if config.tuner:
            self.tuner_cfg = TunerConfig(p99_target_s=config.p99_target_s)
            self.tuner_state = initial_state(self.tuner_cfg)
            self._apply(self.tuner_state.size, self.tuner_state.window_s)
        self.tuner_log: collections.deque[tuple[float, TunerDecision]] = collections.deque(
            maxlen=100
        )
        self._items: list[_Item] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._interval_start_s = clock()
        self._busy_s = 0.0
        self._latencies_s: list[float] = []
        self._service_s = 0.0  # model seconds per request, moving average over recent batches

    @property
    def num_waiting(self) -> int:
        return len(self._items)

    def check_room(self, num_new: int = 1) -> None:
        """Raise QueueFullError unless `num_new` more requests fit (max_queue, max_queue_wait_s)."""
        wait_s = refusal_s(
            len(self._items),
            num_new,
            self._service_s,
            self.config.max_queue,
            self.config.max_queue_wait_s,
        )
        if wait_s is not None:
            raise QueueFullError(len(self._items), max(self.retry_after_s, wait_s))

    async def submit(self, payload: Any, num_tokens: int, lane: str = "interactive") -> Any:
        """Queue one request and wait for its result; QueueFullError when there is no room."""
        self.check_room()
        self.ensure_running()
        future = asyncio.get_running_loop().create_future()
        view = Waiting(self._clock(), num_tokens, LANES.index(lane))
        self._items.append(_Item(view, payload, future))
        self._arrived.set()
        return await future

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def alive(self) -> bool:
        return self._task is None or not self._task.done()

    async def _loop(self) -> None:
        while True:
            self._arrived.clear()  # before deciding: an arrival from here on wakes the wait
            decision = next_batch([it.view for it in self._items], self.policy, self._clock())
            if isinstance(decision, Batch):
                await self._send(decision)
                continue
            timeout = None if decision.until_s is None else decision.until_s - self._clock()
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), timeout)

    async def _send(self, decision: Batch) -> None:
        chosen = set(decision.indices)
        batch = [self._items[i] for i in decision.indices]
        self._items = [it for i, it in enumerate(self._items) if i not in chosen]
        batch = [it for it in batch if not it.future.done()]  # the client went away
        if not batch:
            return
        started = self._clock()
        try:
            results = await self._run([it.payload for it in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)}")
        except Exception as err:  # one bad batch fails its requests, not the loop
            for it in batch:
                if not it.future.done():
                    it.future.set_exception(err)
            return
        finished = self._clock()
        for it, result in zip(batch, results, strict=True):
            if not it.future.done():
                it.future.set_result(result)
            self._latencies_s.append(finished - it.view.arrival_s)
        self._busy_s += finished - started
        per_request_s = (finished - started) / len(batch)
        self._service_s = (
            per_request_s if not self._service_s else (0.8 * self._service_s + 0.2 * per_request_s)
        )
        if self._on_batch is not None:
            record = BatchRecord(
                len(batch),
                LANES[decision.lane],
                decision.bucket,
                decision.reason,
                max(it.view.num_tokens for it in batch),
                finished - started,
            )
            self._on_batch(record)
        self._maybe_tune(finished)

    def _maybe_tune(self, now: float) -> None:
        elapsed = now - self._interval_start_s
        if self.tuner_cfg is None or elapsed < self.config.tuner_interval_s:
            return
        if len(self._latencies_s) < self.tuner_cfg.min_samples:
            return  # a quiet interval: keep collecting rather than decide on a handful
        obs = Observation(
            percentile(self._latencies_s, 99), self._busy_s / elapsed, len(self._latencies_s)
        )
        decision, self.tuner_state = decide(obs, self.tuner_state, self.tuner_cfg, now)
        if decision.changed:
            self._apply(decision.size, decision.window_s)
            log.info("batch tuner: %s (%s)", decision.action, decision.reason)
        self.tuner_log.append((now, decision))
        if self._on_tune is not None:
            self._on_tune(decision)
        self._interval_start_s, self._busy_s, self._latencies_s = now, 0.0, []

    def _apply(self, size: int, window_s: float) -> None:
        self.policy = replace(self.policy, target_size=size, window_s=window_s)
