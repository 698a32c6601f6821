"""The async loop around an engine: steps run in one worker thread, deltas go to per-request queues.

The event loop never blocks on a forward: the torch thread runs steps back to back while there is
work (`_steps`) and hands each step's deltas, built there, to the loop with call_soon_threadsafe;
the loop only wakes it when work arrives after an idle spell.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serving.engine import torch_thread
from serving.engine.detokenize import IncrementalDetokenizer
from serving.engine.offline_pacing import OfflinePacer
from serving.engine.outputs import EngineDeadError, RequestTimeoutError, StreamDelta
from serving.engine.sequence import SeqStatus, Sequence

if TYPE_CHECKING:
    from serving.engine.engine import LLMEngine

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Stream:
    """Deltas waiting for one consumer. A consumer that falls behind (a slow client, a Ray
    streaming hop) or waits out a stream interval finds the steps it missed merged into one
    delta: fewer, larger messages exactly when the path downstream is the bottleneck. Text is
    decoded when a delta is taken, once per message, not once per step."""

    seq: Sequence
    detok: IncrementalDetokenizer
    pending: deque = field(default_factory=deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # the last delta or an error is in
    num_emitted: int = 0
    num_puts: int = 0

    def put(self, item: StreamDelta | BaseException) -> None:
        last = self.pending[-1] if self.pending else None
        # The first delta stays alone (TTFT): the torch thread may deliver the next step's
        # before the consumer took it.
        first = self.num_puts == 1 and len(self.pending) == 1
        self.num_puts += 1
        if isinstance(item, StreamDelta) and isinstance(last, StreamDelta) and not first:
            self.pending[-1] = _merge(last, item)
        else:
            self.pending.append(item)
        self.ready.set()
        if not isinstance(item, StreamDelta) or item.finished:
            self.ended.set()

    async def get(self) -> StreamDelta | BaseException:
        while not self.pending:
            self.ready.clear()
            await self.ready.wait()
        return self.pending.popleft()


def _merge(a: StreamDelta, b: StreamDelta) -> StreamDelta:
    return StreamDelta(
        request_id=a.request_id,
        token_ids=a.token_ids + b.token_ids,
        text=a.text + b.text,
        finished=b.finished,
        finish_reason=b.finish_reason,
        num_prompt_tokens=b.num_prompt_tokens,
        num_output_tokens=b.num_output_tokens,
        queue_wait_s=b.queue_wait_s,
        logprobs=a.logprobs + b.logprobs,
    )


def _with_text(st: _Stream, item: StreamDelta) -> StreamDelta:
    # The engine thread may have appended tokens since this delta: decode up to its own count.
    ids = st.seq.output_token_ids[: item.num_output_tokens]
    return dataclasses.replace(item, text=st.detok.step(ids, item.finished))


def _deliver(items: list[tuple[_Stream, object]]) -> None:
    """On the event loop: one step's deltas into their streams."""
    for st, item in items:
        st.put(item)


def _timed(engine: LLMEngine) -> tuple[list[Sequence], float, float]:
    started_s = time.perf_counter()
    touched = engine.step()
    return touched, started_s, time.perf_counter()


class AsyncDriver:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        # the process's torch thread: the engine was built there, and a step on any other
        # thread would start a second OpenMP team (serving/engine/torch_thread.py)
        self._executor = torch_thread.executor()
        self._streams: dict[str, _Stream] = {}
        self.error: BaseException | None = None
        self._pacer = OfflinePacer(engine.config.offline_duty_fraction)
        self._num_wakes = 0
        engine.observers.append(self._pacer)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def alive(self) -> bool:
        return self.error is None

    def wake(self) -> None:
        self._num_wakes += 1  # a request or abort arrived (read by _rest)
        loop, event = self._loop, self._wake
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def _ensure_started(self) -> None:
        if self.error is not None:
            raise EngineDeadError(f"engine loop died: {self.error!r}")
        if self.running:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="tideserve-engine-loop")

    async def _run(self) -> None:
        engine, loop = self.engine, asyncio.get_running_loop()
        try:
            while True:
                if not engine.has_unfinished():
                    self._wake.clear()
                    if not engine.has_unfinished():  # re-check: a request may have just arrived
                        await self._wake.wait()
                    continue
                wakes = self._num_wakes
                if await loop.run_in_executor(self._executor, self._steps, loop):
                    await self._rest(self._pacer.rest_s, wakes)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # a dead loop must fail every waiter, never hang them
            log.exception("engine loop died")
            self.error = err
            for st in self._streams.values():
                st.put(EngineDeadError(f"engine loop died: {err!r}"))

    async def _rest(self, rest_s: float, wakes: int) -> bool:
        """Idle up to rest_s (offline pacing) unless a request or abort arrives; whether it
        rested. An arrival during the step counted a wake (its event.set may already have run,
        so the clear below would lose it); one after the clear sets the event and ends the wait."""
        if self._num_wakes != wakes:
            return False
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), rest_s)
        return True

    def _delta(self, st: _Stream) -> StreamDelta:
        seq = st.seq
        new_ids = seq.token_ids[seq.num_prompt_tokens + st.num_emitted :]
        logprobs = seq.logprobs[st.num_emitted :] if seq.params.logprobs is not None else []
        st.num_emitted += len(new_ids)
        return StreamDelta(
            request_id=seq.request_id,
            token_ids=new_ids,
            text="",  # decoded once per message when the consumer takes it (_with_text)
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            queue_wait_s=None if seq.admitted_s is None else seq.admitted_s - seq.arrival_s,
            logprobs=logprobs,
        )

    def _steps(self, loop: asyncio.AbstractEventLoop) -> bool:
        """On the torch thread: steps back to back while there is work, each step's deltas
        handed to the event loop without waiting for it. The model's cores never idle while
        the loop (on the reserved core, beside the front door) gets round to dispatching: the
        hand-off cost of awaiting every step was the HTTP path's largest loss with a pinned
        model thread. Deltas are built here, where the sequences change, so the next step
        cannot race them. Returns whether the offline pacer asks for a rest."""
        engine, ended_s = self.engine, None  # gaps between back-to-back steps: the hand-off
        while engine.has_unfinished():
            touched, started_s, end_s = _timed(engine)
            if ended_s is not None:
                engine.loop_gaps_s.append(started_s - ended_s)
            ended_s = end_s
            items = self._deltas(touched)
            if items:
                loop.call_soon_threadsafe(_deliver, items)
            if self._pacer.rest_s > 0:
                return True
        return False

    def _deltas(self, touched: list[Sequence]) -> list[tuple[_Stream, object]]:
        out: list[tuple[_Stream, object]] = []
        for seq in touched:
            st = self._streams.get(seq.request_id)
            if st is None:
                continue
            if seq.status is SeqStatus.FINISHED_TIMEOUT:
                out.append((st, RequestTimeoutError(seq.error)))
            else:
                out.append((st, self._delta(st)))
        return out

    async def stream(
        self, prompt, params, tier, request_id, timeout_s, interval_s=0.0, adapter=None
    ):
        """Deltas of one request. With interval_s > 0, after the first delta (which leaves at
        once: TTFT is unchanged) the tokens of up to interval_s are sent as one delta, so each
        message downstream (a Ray streaming hop, SSE framing) carries several tokens."""
        self._ensure_started()
        seq = self.engine.make_sequence(prompt, params, tier, request_id, timeout_s, adapter)
        if seq.request_id in self._streams:  # live: submit raises the duplicate-id error
            self.engine.submit(seq)
        st = _Stream(seq, IncrementalDetokenizer(self.engine.decode))
        # Registered before the submit: the torch thread steps on its own and may run this
        # sequence's first step before the next line here would.
        self._streams[seq.request_id] = st
        try:
            self.engine.submit(seq)
        except BaseException:
            self._streams.pop(seq.request_id, None)
            raise
        try:
            sent_s = None
            while True:
                if sent_s is not None and interval_s > 0:
                    wait_s = sent_s + interval_s - time.monotonic()
                    if wait_s > 0 and not st.ended.is_set():  # a stream's end never waits
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(st.ended.wait(), wait_s)
                item = await st.get()
                if isinstance(item, BaseException):
                    raise item
                yield _with_text(st, item)
                sent_s = time.monotonic()
                if item.finished:
                    return
        finally:
            self._streams.pop(seq.request_id, None)
            if not seq.finished:  # the caller went away: free its KV at the next step
                self.engine.abort(seq.request_id)
