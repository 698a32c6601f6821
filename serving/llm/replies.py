"""A reply of n choices: OpenAI's response body, or its stream of chunks, from ChoiceStates.

Chat streams open with the role for each choice, then carry content (with its logprobs) and
tool calls as OpenAI sends them (id and name first, then the arguments), and end each choice
with its finish_reason; completions streams carry text and legacy logprobs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from serving.api import openai as p
from serving.api.errors import error_body
from serving.api.http import sse
from serving.llm.choices import (
    ChoiceState,
    TokenText,
    call_deltas,
    chat_logprobs,
    completion_logprobs,
)
from serving.llm.messages import Delta
from serving.llm.tier_share import Hold
from serving.llm.tools import Call

log = logging.getLogger("ray.serve")

_DONE = object()


async def merge_streams(relays: list[AsyncIterator]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from n relays as they arrive; closing it cancels them all."""
    if len(relays) == 1:
        async for item in relays[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, relay: AsyncIterator) -> None:
        try:
            async for item in relay:
                await queue.put((index, item))
        except Exception as err:
            await queue.put((index, err))
        finally:
            await queue.put((index, _DONE))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(relays)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:  # a relay's own finally cancels its replica stream
            task.cancel()


async def drain(relay, state: ChoiceState) -> None:
    async for item in relay:
        state.feed(item)


def service_tier_echo(asked: str | None, tier: str) -> dict:
    """OpenAI names the processing mode used in replies to requests that set service_tier."""
    if asked is None:
        return {}
    if tier == "offline":
        return {"service_tier": "flex"}
    lane = tier == "interactive" and asked in ("priority", "scale", "fast")
    return {"service_tier": asked if lane else "default"}


@dataclass(slots=True)
class Reply:
    rid: str
    model: str
    req: p._SamplingFields
    states: list[ChoiceState]
    token_text: TokenText
    extra: dict = field(default_factory=dict)  # e.g. service_tier
    echo: str = ""  # completions' echo: the prompt's text before each choice's
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def chat(self) -> bool:
        return isinstance(self.req, p.ChatCompletionRequest)

    def _usage(self) -> dict:
        lasts = [s.last for s in self.states if s.last is not None]
        n_prompt = lasts[0].num_prompt_tokens if lasts else 0
        return p.usage(n_prompt, sum(d.num_output_tokens for d in lasts))

    def _logprobs(self, state: ChoiceState, entries) -> dict | None:
        if self.req.num_top_logprobs() is None:
            return None
        if self.chat:
            return chat_logprobs(list(entries), self.token_text)
        lp = completion_logprobs(list(entries), self.token_text, state.num_chars)
        state.num_chars += sum(len(t) for t in lp["tokens"])
        return lp

    # ----- collected ------------------------------------------------------------------------
    def response(self) -> dict:
        choices = []
        for s in self.states:
            lp = self._logprobs(s, s.logprobs)
            if self.chat:
                choices.append(p.chat_choice(s.index, s.message(), s.finish_reason, lp))
            else:
                text = self.echo + "".join(s.text)
                choices.append(p.completion_choice(s.index, text, s.finish_reason, lp))
        build = p.chat_response if self.chat else p.completion_response
        return build(self.rid, self.model, choices, self._usage(), **self.extra)

    # ----- streamed -------------------------------------------------------------------------
    def _chunk(self, index: int, delta_or_text, finish_reason=None, logprobs=None) -> dict:
        if self.chat:
            chunk = p.chat_chunk(
                self.rid, self.model, self.created, delta_or_text, finish_reason, index, logprobs
            )
        else:
            chunk = p.completion_chunk(
                self.rid, self.model, self.created, delta_or_text, finish_reason, index, logprobs
            )
        return {**chunk, **self.extra}

    def opening(self) -> list[dict]:
        if self.chat:  # OpenAI opens a chat stream with the role
            return [self._chunk(s.index, {"role": "assistant", "content": ""}) for s in self.states]
        return [self._chunk(s.index, self.echo) for s in self.states] if self.echo else []

    def frames(self, index: int, item: Delta) -> list[dict]:
        state = self.states[index]
        num_calls = len(state.calls)
        pieces = state.feed(item)
        text = "".join(x for x in pieces if isinstance(x, str))
        lp = self._logprobs(state, item.logprobs) if item.logprobs else None
        frames = []
        if text or lp:
            frames.append(self._chunk(index, {"content": text} if self.chat else text, None, lp))
        for k, call in enumerate(x for x in pieces if isinstance(x, Call)):
            frames += [self._chunk(index, d) for d in call_deltas(num_calls + k, call)]
        if item.finished:
            frames.append(self._chunk(index, {} if self.chat else "", state.finish_reason))
        return frames

    def usage_frame(self) -> dict:
        """The final chunk of `stream_options.include_usage`: no choices, only usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self._usage(),
            **self.extra,
        }


async def sse_stream(
    reply: Reply, items: AsyncIterator[tuple[int, Delta]], hold: Hold | None = None
) -> AsyncIterator[str]:
    """The SSE text of a streamed reply. One write per replica message: a delta's frames
    (content, tool calls, finish) are encoded and sent together, the opening frames with the
    first delta. A failure after the stream started (a replica died) becomes an error event,
    never a hang. `hold` comes back once the replica's items end, fail or the client leaves."""
    opening = "".join(sse(frame) for frame in reply.opening())
    try:
        async for index, item in items:
            data = opening + "".join(sse(frame) for frame in reply.frames(index, item))
            if data:  # a delta may hold no text yet (a UTF-8 character split across tokens)
                yield data
                opening = ""
    except Exception as err:  # mid-stream failure: tell the client, then end the stream
        # The type only: an error's text may quote the request, and prompts stay out of logs.
        log.warning("stream %s failed: %s", reply.rid, type(err).__name__)
        message = f"generation failed mid-stream ({type(err).__name__}); retry"
        yield opening + sse(error_body(message, "server_error", code="replica_failed"))
        yield sse("[DONE]")
        return
    finally:
        if hold is not None:
            hold.release()
    usage = reply.req.stream_options is not None and reply.req.stream_options.include_usage
    yield opening + (sse(reply.usage_frame()) if usage else "") + sse("[DONE]")
