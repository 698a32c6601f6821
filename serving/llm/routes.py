"""The HTTP routes of the ingress: /v1/models, /v1/completions, /v1/chat/completions, /health.

SSE frames are `data: <json>\\n\\n` and end with `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries usage and no choices, as OpenAI sends it.
A failure after the stream started (a replica died) becomes an error event, never a hang.
"""

import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from ray import serve

from serving.api import openai as p
from serving.api.errors import ApiError, check_model_name, error_body
from serving.api.http import (
    check_api_key,
    install_error_handlers,
    model_list,
    read_json,
    request_tier,
    sse,
    validate,
)
from serving.llm.dispatch import OpenStream
from serving.llm.ingress import Ingress
from serving.llm.messages import Delta

log = logging.getLogger("ray.serve")
api = install_error_handlers(FastAPI(title="tideserve", docs_url=None, redoc_url=None))


def _chat_chunk(rid, model, created, text: str, finish_reason):
    return p.chat_chunk(rid, model, created, {"content": text} if text else {}, finish_reason)


# Decorated where it is defined: Serve rewrites the routes' `self` when the decorator runs, and a
# replica re-imports this module, so the rewrite must happen at import, not in build_app().
@serve.ingress(api)
class HttpIngress(Ingress):
    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "pools": dict(self.available)}

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return model_list(self.model_name)

    async def _prepare(self, request: Request, kind: type):
        check_api_key(self.api_key, request)
        req = validate(kind, await read_json(request, self.config.server.max_body_bytes))
        check_model_name(req.model, self.model_name)
        tier = request_tier(req.priority, request.headers.get("x-priority"))
        return req, tier

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._complete(
            request,
            p.CompletionRequest,
            lambda req: self._encode_prompt(req.prompt),
            "cmpl",
            p.completion_chunk,
            "text_completion",
            p.completion_response,
        )

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._complete(
            request,
            p.ChatCompletionRequest,
            lambda req: self._encode_chat(req.messages),
            "chatcmpl",
            _chat_chunk,
            "chat.completion.chunk",
            p.chat_response,
        )

    async def _complete(
        self,
        request: Request,
        kind: type,
        encode,
        id_prefix: str,
        chunk,
        chunk_object: str,
        respond,
    ):
        """The shared path of both endpoints: only encoding and response shapes differ."""
        req, tier = await self._prepare(request, kind)
        ids = encode(req)
        opened = await self._open(ids, self._params(req, len(ids)), tier)
        rid = p.new_id(id_prefix)
        if req.stream:
            frames = self._stream(opened, req, rid, chunk, chunk_object)
            return StreamingResponse(frames, media_type="text/event-stream")
        text, last = await self._collect(opened, req.stop)
        return respond(
            rid,
            self.model_name,
            text,
            last.finish_reason,
            last.num_prompt_tokens,
            last.num_output_tokens,
        )

    async def _collect(self, opened: OpenStream, stops: list[str]) -> tuple[str, Delta]:
        try:
            parts = [item async for item in self._relay(opened, stops)]
        except Exception as err:  # the replica died mid-generation: a clean 503, not a bare 500
            log.warning("generation on %s failed: %s", opened.pool, type(err).__name__)
            raise ApiError(
                503,
                "the replica serving this request failed mid-generation; retry",
                type_="server_error",
                code="replica_failed",
                retry_after_s=self.config.server.retry_after_s,
            ) from None
        return "".join(item.text for item in parts), parts[-1]

    async def _stream(self, opened, req, rid, chunk, obj: str) -> AsyncIterator[str]:
        created, model, last = int(time.time()), self.model_name, opened.first
        if obj == "chat.completion.chunk":  # OpenAI opens a chat stream with the role
            yield sse(p.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, None))
        try:
            async for item in self._relay(opened, req.stop):
                last = item
                if item.text:
                    yield sse(chunk(rid, model, created, item.text, None))
        except Exception as err:  # mid-stream failure: tell the client, then end the stream
            # The type only: an error's text may quote the request, and prompts stay out of logs.
            log.warning("stream %s failed: %s", rid, type(err).__name__)
            message = f"generation failed mid-stream ({type(err).__name__}); retry"
            yield sse(error_body(message, "server_error", code="replica_failed"))
            yield sse("[DONE]")
            return
        yield sse(chunk(rid, model, created, "", last.finish_reason))
        if req.stream_options is not None and req.stream_options.include_usage:
            yield sse(
                p.usage_chunk(
                    rid, model, created, obj, last.num_prompt_tokens, last.num_output_tokens
                )
            )
        yield sse("[DONE]")
