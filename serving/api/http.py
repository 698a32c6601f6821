"""The HTTP layer both apps share: error bodies, the API key, the body cap, JSON and SSE.

Every function takes plain values (a key, a byte cap), never an app object, so the LLM ingress
and the embeddings replica use the same code without knowing each other.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.tiers import TIERS
from serving.api.errors import ApiError, error_body


async def api_error_response(_: Request, err: ApiError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after_s)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def http_error_response(_: Request, err: StarletteHTTPException) -> JSONResponse:
    """Unknown paths (404) and wrong methods (405) get OpenAI's error body too."""
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(str(err.detail), kind), status_code=err.status_code, headers=err.headers
    )


async def validation_error_response(_: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(err)
    return JSONResponse(error_body(message, "invalid_request_error", where or None), 400)


def install_error_handlers(app: FastAPI) -> FastAPI:
    """Every error an app can answer with leaves as an OpenAI error body."""
    app.add_exception_handler(ApiError, api_error_response)
    app.add_exception_handler(StarletteHTTPException, http_error_response)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    return app


def api_key_from_env(key_env: str | None) -> str | None:
    """The key named by `server.api_key_env`; None when auth is off. An unset variable is an
    error at start-up: a server that meant to check keys must not silently accept everyone."""
    if not key_env:
        return None
    key = os.environ.get(key_env)
    if not key:
        raise ValueError(f"server.api_key_env={key_env!r} names an unset environment variable")
    return key


def check_api_key(api_key: str | None, request: Request) -> None:
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Digests of equal length: compare_digest is constant-time only for equal lengths, and
    # comparing the raw strings would leak the key's length.
    given = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
    expected = hashlib.sha256(api_key.encode()).digest()
    if not (hmac.compare_digest(given, expected) and scheme.lower() == "bearer"):
        raise ApiError(
            401,
            "invalid or missing API key (Authorization: Bearer ...)",
            type_="authentication_error",
            code="invalid_api_key",
        )


async def read_json(request: Request, max_body_bytes: int) -> dict:
    """The body, size-capped while it is read (a chunked upload declares no length, so the cap
    is enforced on the bytes received); malformed JSON is a 400, not a 500."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise ApiError(400, "content-length is not an integer", param="content-length") from None
    if declared > max_body_bytes:
        raise _too_large(declared, max_body_bytes)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_body_bytes:
            raise _too_large(len(raw), max_body_bytes)
    return parse_json_object(bytes(raw))


def parse_json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"body is not valid JSON: {err}") from None
    except RecursionError:  # "[[[[..." a million deep fits under the size cap
        raise ApiError(400, "body is not valid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise ApiError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"body must be a JSON object, not {type(body).__name__}")
    return body


def _too_large(num_bytes: int, cap: int) -> ApiError:
    return ApiError(
        413,
        f"request body of {num_bytes} bytes exceeds the {cap}-byte limit (server.max_body_bytes)",
        code="request_too_large",
    )


_TYPE_TAGS = frozenset({"str", "int", "bool", "float", "none", "dict", "list"})


def _union_member(part) -> bool:
    """Pydantic names the union member tried (`stop.str`, `tool_choice.NamedToolChoice`) in an
    error's location; the user named only the field."""
    if not isinstance(part, str):
        return False
    return part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper()


def validate(model: type, body: dict):
    """Pydantic validation with the first problem as an OpenAI 400 naming the field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"] if not _union_member(x))
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = "unknown field"
        raise ApiError(400, f"{where}: {msg}" if where else msg, param=where or None) from None


SERVICE_TIER_TIERS = {"priority": "interactive", "scale": "interactive", "fast": "interactive"}
SERVICE_TIER_TIERS["flex"] = "offline"  # OpenAI's flex: cheaper, slower, may wait: our offline


def priority_tier(priority: int | str) -> str:
    """vLLM's integer priority (lower runs first; 0 is its default) or one of our tier names."""
    if isinstance(priority, str):
        if priority not in TIERS:
            raise ApiError(
                400, f"priority={priority!r} is not one of {list(TIERS)}", param="priority"
            )
        return priority
    return TIERS[min(max(priority, 0), len(TIERS) - 1)]


def request_tier(
    body_priority: int | str | None,
    header: str | None,
    service_tier: str | None = None,
    default_tier: str = "interactive",
) -> str:
    """The tier of a request, first match wins:

    1. the body's `priority` (vLLM's integer: <= 0 interactive, 1 analytical, >= 2 offline;
       or a tier name);
    2. the body's `service_tier` when it asks for a lane: priority, scale, fast -> interactive,
       flex -> offline;
    3. the `x-priority` header (a tier name);
    4. `default_tier` (server.service_tier_default), which is also what service_tier auto and
       default mean.
    Anything else is a 400 naming the field and the allowed values."""
    if body_priority is not None:
        return priority_tier(body_priority)
    if service_tier in SERVICE_TIER_TIERS:
        return SERVICE_TIER_TIERS[service_tier]
    if header:
        if header not in TIERS:
            raise ApiError(
                400, f"x-priority={header!r} is not one of {list(TIERS)}", param="x-priority"
            )
        return header
    return default_tier


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def model_list(served_name: str, adapter_cards: list[dict] | None = None) -> dict:
    """The body of GET /v1/models: the served model, then its LoRA adapters' cards (each with
    the base as `parent`, as vLLM lists them)."""
    card = {"id": served_name, "object": "model", "created": 0, "owned_by": "tideserve"}
    return {"object": "list", "data": [card, *(adapter_cards or [])]}
