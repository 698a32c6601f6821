"""The parts of a chat request: messages, tools, tool_choice, response_format (strict types).

Unknown keys inside them are a 400 naming the path (`messages.0.foo`); content parts other than
text (images, audio, files) are refused by name.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.api.errors import ApiError

STRICT = ConfigDict(extra="forbid", strict=True)
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_unicode(where: str, text: str) -> str:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer can encode: a 400, not a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{where} holds invalid Unicode at position {err.start} (a lone surrogate)"
        ) from None
    return text


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = STRICT
    name: str
    arguments: str  # a JSON object, serialised (as OpenAI sends it back)

    def arguments_object(self) -> Any:
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return self.arguments


class ToolCall(BaseModel):
    model_config = STRICT
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None  # passed to the chat template, which may or may not render it
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: the call answered
    refusal: str | None = None  # an assistant's earlier refusal, rendered as its text

    @model_validator(mode="before")
    @classmethod
    def _only_text_parts(cls, data: Any) -> Any:
        content = data.get("content") if isinstance(data, dict) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ApiError(
                        400,
                        f"messages: content part type {kind!r} is not supported; only 'text'",
                        param="messages",
                    )
        return data

    @field_validator("content")
    @classmethod
    def _encodable(cls, content: str | list[TextPart] | None):
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.text if isinstance(part, TextPart) else part
            if text:
                valid_unicode("content", text)
        return content

    @model_validator(mode="after")
    def _role_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls is allowed on assistant messages only")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id (the call it answers)")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or self.refusal or ""


class FunctionDef(BaseModel):
    model_config = STRICT
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    strict: bool | None = None  # calls are always decoded under the schema, strict or not

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _FUNCTION_NAME.match(name):
            raise ValueError(f"function name {name!r} must match [A-Za-z0-9_-]{{1,64}}")
        return name


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: str
    description: str | None = None
    # OpenAI's key is `schema`; pydantic reserves that attribute name on models.
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # decoding is always under the schema, strict or not


class ResponseFormat(BaseModel):
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type 'json_schema' and only with it")
        return self
