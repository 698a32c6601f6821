"""Ingress: OpenAI-compatible HTTP (FastAPI through serve.ingress) and the handle API.

It validates, counts tokens (it owns the tokenizer and chat template), classifies the tier
(`x-priority` header or `priority` field, default interactive), picks a pool (serving/dispatch.py)
and relays the replica's token stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import protocol as p
from serving.config import AppConfig
from serving.dispatch import OpenStream, RefusalMemo, StopStrings, open_stream

log = logging.getLogger("ray.serve")
api = FastAPI(title="tideserve", docs_url=None, redoc_url=None)


@api.exception_handler(p.ApiError)
async def api_error_response(_: Request, err: p.ApiError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(err.retry_after_s)))
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    """Unknown paths (404) and wrong methods (405) get OpenAI's error body too."""
    kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        p.error_body(str(err.detail), kind), status_code=err.status_code, headers=err.headers
    )


@api.exception_handler(RequestValidationError)
async def validation_error_response(_: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(err)
    return JSONResponse(p.error_body(message, "invalid_request_error", where or None), 400)


class Ingress:
    def __init__(self, config: dict, hot, cold) -> None:
        from transformers import AutoTokenizer

        from serving.models import resolve_model_dir, served_name_for

        self.config = AppConfig.from_args(config)
        self.handles = {"hot": hot, "cold": cold}
        # Hot always has >= 1 replica (config-enforced), so requests may wait on Serve's queue
        # for it; cold may have none, and is used only once the watcher has seen it running.
        self.available = {"hot": True, "cold": False}
        model_dir = resolve_model_dir(self.config.model.source)
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(model_dir), trust_remote_code=self.config.model.trust_remote_code
        )
        self.model_name = self.config.model.served_name or served_name_for(self.config.model.source)
        key_env = self.config.server.api_key_env
        self.api_key = os.environ.get(key_env) if key_env else None
        if key_env and not self.api_key:
            raise ValueError(f"server.api_key_env={key_env!r} names an unset environment variable")
        self.fingerprint = self.config.replica_fingerprint()
        self.verified: dict[str, bool] = {}
        self.refusals = RefusalMemo()
        self.app_name = _app_name()
        self._watcher: asyncio.Task | None = None
        self.num_requests = 0  # requests that reached pool choice; read by the forecast controller
        self.emptying: set[str] = set()  # pools the forecast controller is scaling to zero

    # ----- pools ---------------------------------------------------------------------------------
    async def _watch_pools(self, period_s: float = 2.0) -> None:
        """Keep `available` in step with the pools: cold is used only while it has a running
        replica (an empty pool would park requests until one appears); either pool is refused
        outright if its replicas report another config fingerprint than the ingress's (R9)."""
        while True:
            await asyncio.sleep(period_s)
            await self._poll_pools()

    async def _poll_pools(self) -> None:
        try:
            counts = await asyncio.to_thread(pool_replica_counts, self.app_name)
            for pool in self.handles:
                if pool not in counts:  # mid-deploy the status may omit it: keep the last view
                    continue
                running = counts[pool] > 0 and pool not in self.emptying
                ok = await self._fingerprint_ok(pool) if running else pool == "hot"
                self.available[pool] = ok
        except Exception as err:  # the controller may be restarting; keep the last view
            log.warning("pool status poll failed: %s", err)

    async def _fingerprint_ok(self, pool: str) -> bool:
        if pool not in self.verified:
            theirs = await asyncio.wait_for(self.handles[pool].fingerprint.remote(), 30)
            self.verified[pool] = theirs == self.fingerprint
            if not self.verified[pool]:
                log.error(
                    "%s replicas run config %s, ingress has %s: not routing to them",
                    pool,
                    theirs[:12],
                    self.fingerprint[:12],
                )
        return self.verified[pool]

    async def ensure_watching(self) -> None:
        """The first request waits for one poll, so a fresh ingress does not answer 503."""
        if self._watcher is None or self._watcher.done():
            await self._poll_pools()
            self._watcher = asyncio.get_running_loop().create_task(self._watch_pools())

    # ----- shared request path ----------------------------------------------------------------
    def _tier(self, body_priority: str | None, header: str | None) -> str:
        tier = body_priority or header or "interactive"
        if tier not in p.TIERS:
            raise p.ApiError(
                400, f"priority={tier!r} is not one of {list(p.TIERS)}", param="priority"
            )
        return tier

    def _params(self, req: p._SamplingFields, num_prompt_tokens: int) -> dict:
        srv = self.config.server
        limit = self.config.engine.max_model_len
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            room = (limit - num_prompt_tokens) if limit else srv.default_max_tokens
            max_tokens = max(1, min(srv.default_max_tokens, room))
        elif max_tokens > srv.max_tokens_limit:
            raise p.ApiError(
                400,
                f"max_tokens={max_tokens} is out of range; allowed: 1 <= "
                f"max_tokens <= {srv.max_tokens_limit}",
                param="max_tokens",
            )
        return {
            "max_tokens": max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "seed": req.seed,
            "ignore_eos": req.ignore_eos,
        }

    def set_pool_target(self, pool: str, target: int) -> None:
        """The forecast controller announces a new replica target before it applies it. A pool
        going to zero gets no new request from now on, not one status poll later: Serve's handle
        would park a request for an empty deployment until a replica comes back."""
        if target == 0 and pool != "hot":
            self.emptying.add(pool)
            self.available[pool] = False
        else:
            self.emptying.discard(pool)  # the watcher marks it available once a replica runs

    def request_count(self) -> int:
        """Cumulative requests since this ingress started (the controller diffs two readings)."""
        return self.num_requests

    async def _open(self, prompt_ids: list[int], params: dict, tier: str) -> OpenStream:
        self.num_requests += 1
        await self.ensure_watching()
        request = {
            "prompt_token_ids": prompt_ids,
            "params": params,
            "tier": tier,
            "request_id": p.new_id("req"),
        }
        return await open_stream(
            self.handles,
            self.available,
            request,
            self.config.server.retry_after_s,
            self.refusals,
            time.monotonic(),
        )

    async def _relay(self, opened: OpenStream, stops: list[str]) -> AsyncIterator[dict]:
        """Replica deltas with stop strings applied; cancels the replica stream on exit."""
        cut = StopStrings(stops)
        try:
            item = opened.first
            while True:
                text = cut.feed(item["text"], item["finished"])
                if cut.stopped:
                    yield {**item, "text": text, "finished": True, "finish_reason": "stop"}
                    return
                yield {**item, "text": text}
                if item["finished"]:
                    return
                item = await opened.rest.__anext__()
        finally:
            if not item["finished"]:  # client gone or stop string hit: free the KV now
                opened.cancel()

    def _encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        return list(prompt)

    def _encode_chat(self, messages: list[p.ChatMessage]) -> list[int]:
        turns = [{"role": m.role, "content": m.text()} for m in messages]
        text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    # ----- handle API (other Ray apps) ------------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> dict:
        """One completion; returns text, token ids, finish reason, usage and the pool used."""
        parts = [d async for d in self.generate_stream(prompt, max_tokens, priority, **sampling)]
        last = parts[-1]
        return {
            "text": "".join(d["text"] for d in parts),
            "token_ids": [t for d in parts for t in d["token_ids"]],
            "finish_reason": last["finish_reason"],
            "usage": p.usage(last["num_prompt_tokens"], last["num_output_tokens"]),
            "pool": last["pool"],
        }

    async def generate_stream(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> AsyncIterator[dict]:
        unknown = sorted(set(sampling) - HANDLE_SAMPLING_KEYS)
        if unknown:  # HTTP ignores unknown fields (SDK upgrades); a Python caller made a typo
            raise p.ApiError(
                400,
                f"unknown argument(s) {unknown}; allowed: {sorted(HANDLE_SAMPLING_KEYS)}",
                param=unknown[0],
            )
        body = {"prompt": prompt, "max_tokens": max_tokens, "priority": priority, **sampling}
        req = validate(p.CompletionRequest, body)
        ids = self._encode_prompt(req.prompt)
        opened = await self._open(ids, self._params(req, len(ids)), req.priority or "interactive")
        async for item in self._relay(opened, req.stop):
            yield {
                k: item[k]
                for k in (
                    "text",
                    "token_ids",
                    "finished",
                    "finish_reason",
                    "num_prompt_tokens",
                    "num_output_tokens",
                    "pool",
                )
            }


HANDLE_SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "max_completion_tokens"}
)


def check_api_key(ingress: Ingress, request: Request) -> None:
    if ingress.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Digests of equal length: compare_digest is constant-time only for equal lengths, and
    # comparing the raw strings would leak the key's length.
    given = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
    expected = hashlib.sha256(ingress.api_key.encode()).digest()
    if not (hmac.compare_digest(given, expected) and scheme.lower() == "bearer"):
        raise p.ApiError(
            401,
            "invalid or missing API key (Authorization: Bearer ...)",
            type_="authentication_error",
            code="invalid_api_key",
        )


async def read_json(ingress: Ingress, request: Request) -> dict:
    """The body, size-capped while it is read (a chunked upload declares no length, so the cap
    is enforced on the bytes received); malformed JSON is a 400, not a 500."""
    cap = ingress.config.server.max_body_bytes
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise p.ApiError(400, "content-length is not an integer", param="content-length") from None
    if declared > cap:
        raise _too_large(declared, cap)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > cap:
            raise _too_large(len(raw), cap)
    return parse_json_object(bytes(raw))


def parse_json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise p.ApiError(400, f"body is not valid JSON: {err}") from None
    except RecursionError:  # "[[[[..." a million deep fits under the size cap
        raise p.ApiError(400, "body is not valid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise p.ApiError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise p.ApiError(400, f"body must be a JSON object, not {type(body).__name__}")
    return body


def _too_large(num_bytes: int, cap: int) -> p.ApiError:
    return p.ApiError(
        413,
        f"request body of {num_bytes} bytes exceeds the {cap}-byte limit (server.max_body_bytes)",
        code="request_too_large",
    )


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def validate(model: type, body: dict):
    """Pydantic validation with the first problem as an OpenAI 400 naming the field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise p.ApiError(400, f"{where}: {msg}" if where else msg, param=where or None) from None


def pool_replica_counts(app_name: str) -> dict[str, int]:
    """Running replicas per deployment of this app, from the Serve controller."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {
        name: sum(n for state, n in dep.replica_states.items() if str(state).endswith("RUNNING"))
        for name, dep in app.deployments.items()
    }


def _app_name() -> str:
    from ray import serve

    try:
        return serve.get_replica_context().app_name
    except Exception:  # constructed outside a replica (unit tests)
        return "tideserve"


def now_s() -> int:
    return int(time.time())


__all__ = ["Ingress", "api", "check_api_key", "now_s", "read_json", "sse", "validate"]
