"""OpenAI `/v1/embeddings`: the request body and the response shape.

`input` is a string, a list of strings, a token array, or a list of token arrays, as OpenAI's API
takes it; token ids are this model's. `encoding_format: base64` is little-endian float32 bytes in
base64, which the openai SDK asks for by default and decodes itself.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.tiers import check_tier

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    priority: str | None = None

    @field_validator("input")
    @classmethod
    def _check_input(cls, value):
        items = _as_items(value)
        if not items:
            raise ValueError("must not be empty")
        if len(items) > MAX_INPUTS:
            raise ValueError(f"has {len(items)} items; at most {MAX_INPUTS} per request")
        for i, item in enumerate(items):
            if len(item) == 0:  # OpenAI refuses empty strings and empty token arrays too
                raise ValueError(f"item {i} is empty")
        return value

    @field_validator("priority")
    @classmethod
    def _check_priority(cls, value):
        return value if value is None else check_tier(value)

    def items(self) -> list[str | list[int]]:
        return _as_items(self.input)


def _as_items(value) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(x, int) for x in value):
        return [list(value)]  # one token array
    return list(value)


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embedding_response(
    model: str, vectors: list[list[float]], num_prompt_tokens: int, encoding_format: str
) -> dict:
    data = [
        {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": num_prompt_tokens, "total_tokens": num_prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
