"""One choice of a reply, built from the replica's deltas: the same code streams and collects.

A choice turns deltas into OpenAI pieces: content text, tool calls (serving/llm/tools.py) and
logprobs in the endpoint's format (chat: `{"content": [...]}`; completions: the legacy
`tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from serving.engine.outputs import TokenLogprob
from serving.llm.messages import Delta
from serving.llm.tools import Call, ToolPlan, ToolStream

_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way


class TokenText:
    """Token id -> its text, cached (logprobs name every top token of every step)."""

    def __init__(self, tokenizer) -> None:
        self._decode = functools.lru_cache(maxsize=65536)(
            lambda i: tokenizer.decode([i], skip_special_tokens=False)
        )

    def __call__(self, token_id: int) -> str:
        return self._decode(token_id)


def _lp(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict | None:
    if not entries:
        return None

    def one(token_id: int, logprob: float) -> dict:
        s = text(token_id)
        return {"token": s, "logprob": _lp(logprob), "bytes": list(s.encode("utf-8"))}

    content = [
        {**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, offset: int) -> dict:
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [_lp(e.logprob) for e in entries],
        "top_logprobs": [{text(t): _lp(lp) for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


@dataclass(slots=True)
class ChoiceState:
    index: int
    plan: ToolPlan | None = None
    tools: ToolStream | None = None
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    last: Delta | None = None
    num_chars: int = 0  # completions' text_offset runs over the choice's text

    def __post_init__(self) -> None:
        if self.plan is not None:
            self.tools = ToolStream(self.plan)

    def feed(self, item: Delta) -> list[str | Call]:
        """Content pieces and complete calls this delta makes visible."""
        self.last = item
        self.logprobs.extend(item.logprobs)
        if self.tools is None:
            pieces: list[str | Call] = [item.text] if item.text else []
        else:
            pieces = self.tools.feed(item.text)
            if item.finished:
                pieces += self.tools.finish()
        for piece in pieces:
            if isinstance(piece, Call):
                self.calls.append(piece)
            else:
                self.text.append(piece)
        return pieces

    @property
    def finish_reason(self) -> str | None:
        if self.last is None or not self.last.finished:
            return None
        if self.calls and self.last.finish_reason == "stop":
            return "tool_calls"
        return self.last.finish_reason

    def message(self) -> dict:
        """The chat `message` of a collected (non-streamed) choice."""
        content = "".join(self.text)
        if not self.calls:
            return {"role": "assistant", "content": content}
        return {
            "role": "assistant",
            "content": content.strip() or None,
            "tool_calls": [call_dict(c) for c in self.calls],
        }


def call_dict(call: Call) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def call_deltas(index: int, call: Call) -> list[dict]:
    """A call as OpenAI streams it: id, type and name first, then the arguments."""
    head = {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [
        {"tool_calls": [head]},
        {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]},
    ]
