"""OpenAI-compatible request bodies and response shapes.

Strict where OpenAI is strict: booleans are booleans and integers are integers ("stream": "yes"
is a 400), an unknown field is a 400 naming it, and a field the server does not implement is a
400 naming it (serving/api/openai_fields.py lists them; docs/openai.md is the user's table).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.tiers import check_tier
from serving.api.openai_chat import (
    STRICT,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolChoice,
    valid_unicode,
)
from serving.api.openai_fields import check_fields

MAX_N = 16  # choices per request; each is its own sequence in the engine
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
__all__ = ["ChatMessage", "NamedToolChoice", "ResponseFormat", "Tool"]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False
    include_obfuscation: Literal[False] | None = None  # no obfuscation padding is sent


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    ENDPOINT_FIELDS: ClassVar[frozenset[str]] = frozenset()

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(default=None, validate_default=True)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    service_tier: Literal[SERVICE_TIERS] | None = None  # type: ignore[valid-type]
    # vLLM's extras
    top_k: int | None = Field(default=None, ge=-1)  # 0 and -1 (vLLM's "off") disable it
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    ignore_eos: bool | None = None
    # vLLM's integer priority (lower runs first) or one of our tier names
    priority: int | str | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        known = set(_SamplingFields.model_fields) | set(cls.ENDPOINT_FIELDS)
        return check_fields(data, known)

    @field_validator("priority")
    @classmethod
    def _known_tier(cls, tier: int | str | None) -> int | str | None:
        return tier if tier is None or isinstance(tier, int) else check_tier(tier)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias key {key!r} must be a token id (a decimal string)")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias[{key}]={value} is out of range [-100, 100]")
        return bias

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        for s in stops:
            valid_unicode("stop", s)
        return stops

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_choices(self) -> int:
        return self.n or 1

    def num_top_logprobs(self) -> int | None:
        """None: no logprobs; k: the sampled token's and the top k."""
        raise NotImplementedError

    def grammar_source(self) -> tuple[str, str] | None:
        """(kind, text) of the output constraint asked by response_format, if any."""
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return ("json_object", "")
        return ("json_schema", json.dumps(rf.json_schema.schema_))


class CompletionRequest(_SamplingFields):
    ENDPOINT_FIELDS: ClassVar[frozenset[str]] = frozenset({"prompt", "echo", "best_of", "logprobs"})
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    logprobs: int | None = Field(default=None, ge=0, le=5)

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
            valid_unicode("prompt", self.prompt)
        if self.best_of not in (None, self.num_choices):
            raise ValueError(f"best_of={self.best_of} is not supported; only best_of == n")
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs is not supported (prompt logprobs are not computed)"
            )
        return self

    def num_top_logprobs(self) -> int | None:
        return self.logprobs


class ChatCompletionRequest(_SamplingFields):
    ENDPOINT_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {"messages", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs"}
    )
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise ValueError("messages must hold at least one message")
        return messages

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        choice = self.tool_choice
        names = [t.function.name for t in self.tools or []]
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, not in tools {names}")
        if choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice asks for a tool call but tools is empty")
        if len(set(names)) != len(names):
            raise ValueError(f"tools: function names must be unique, got {names}")
        if self.calls_tools and self.grammar_source() is not None:
            raise ValueError(
                "response_format cannot be combined with tools unless tool_choice is 'none'"
            )
        return self

    @property
    def calls_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def num_top_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_choice(index: int, text: str, finish_reason, logprobs=None) -> dict:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


def chat_choice(index: int, message: dict, finish_reason, logprobs=None) -> dict:
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    }


def completion_response(rid, model, choices: list[dict], usage_: dict, **extra) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
        **extra,
    }


def chat_response(rid, model, choices: list[dict], usage_: dict, **extra) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
        **extra,
    }


def completion_chunk(rid, model, created, text, finish_reason, index=0, logprobs=None) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
        ],
    }


def chat_chunk(rid, model, created, delta: dict, finish_reason, index=0, logprobs=None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        ],
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
