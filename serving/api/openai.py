"""OpenAI-compatible request bodies and response shapes (the subset common clients send).

Unknown fields are accepted and ignored, as OpenAI-compatible servers do, so SDK upgrades that add
fields keep working; known fields are validated and a bad one is a 400 naming it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.tiers import check_tier


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    n: int = 1
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = Field(default=None, validate_default=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    priority: str | None = None
    logprobs: Any = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"n={n} is not supported; only n=1 is")
        return n

    @field_validator("priority")
    @classmethod
    def _known_tier(cls, tier: str | None) -> str | None:
        return tier if tier is None else check_tier(tier)

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any) -> Any:
        if value not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        for s in stops:
            _valid_unicode("stop", s)
        return stops

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ValueError("prompt: batched prompts are not supported; send one per request")
            self.prompt = p[0]
        if not self.prompt:
            raise ValueError("prompt is empty")
        if isinstance(self.prompt, str):
            _valid_unicode("prompt", self.prompt)
        if self.echo:
            raise ValueError("echo is not supported")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    @field_validator("content")
    @classmethod
    def _encodable(cls, content: str | list[TextPart] | None):
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.text if isinstance(part, TextPart) else part
            if text:
                _valid_unicode("content", text)
        return content

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise ValueError("messages must hold at least one message")
        return messages


def _valid_unicode(where: str, text: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer can encode: a 400, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{where} holds invalid Unicode at position {err.start} (a lone surrogate)"
        ) from None
    return text


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_response(rid, model, text, finish_reason, n_prompt, n_out) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage(n_prompt, n_out),
    }


def chat_response(rid, model, text, finish_reason, n_prompt, n_out) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage(n_prompt, n_out),
    }


def completion_chunk(rid, model, created, text, finish_reason) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
    }


def chat_chunk(rid, model, created, delta: dict, finish_reason) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }


def usage_chunk(rid, model, created, obj: str, n_prompt: int, n_out: int) -> dict:
    """The final chunk of `stream_options.include_usage`: no choices, only usage."""
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(n_prompt, n_out),
    }
