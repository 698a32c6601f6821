"""The HTTP routes of the ingress: /v1/models, /v1/completions, /v1/chat/completions, /health;
/v1/files and /v1/batches come from serving/batch/routes.py (the offline lane).

SSE frames are `data: <json>\\n\\n` and end with `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries usage and no choices, as OpenAI sends it.
A failure after the stream started (a replica died) becomes an error event, never a hang.
"""

import asyncio
import logging
import weakref
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
from serving.batch.routes import BatchRoutes
from serving.batch.routes import router as batch_router
from serving.llm import tools
from serving.llm.autoscaling_stats import IngressStats
from serving.llm.choices import ChoiceState
from serving.llm.ingress import Ingress
from serving.llm.replies import Reply, drain, merge_streams, service_tier_echo
from serving.llm.tier_share import Hold

log = logging.getLogger("ray.serve")
api = install_error_handlers(FastAPI(title="tideserve", docs_url=None, redoc_url=None))
api.include_router(batch_router)  # before serve.ingress below binds the routes to the class


# Decorated where it is defined: Serve rewrites the routes' `self` when the decorator runs, and a
# replica re-imports this module, so the rewrite must happen at import, not in build_app().
@serve.ingress(api)
class HttpIngress(BatchRoutes, Ingress):
    def __init__(
        self, config: dict, hot, cold, lane: dict | None = None, config_crc: int = 0
    ) -> None:
        super().__init__(config, hot, cold)
        self.start_lane(lane)  # `lane`: the batch and controller sections (serving/app.py)
        self.config_crc = config_crc  # of the whole app config, for the autoscaling policy

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaling policy reads this (autoscaling/serve_policy.py)."""
        return self.autoscaling_stats().to_metrics()

    def autoscaling_stats(self) -> IngressStats:
        """The same numbers, typed: the opt-in controller actor reads them with a remote call
        (autoscaling/serve_io.py) and diffs the cumulative counts into rates."""
        return IngressStats(
            num_requests=self.num_requests,
            num_refused=self.num_refused,
            offline_cold_replicas=max(0, int(self.offline_cold_replicas_wanted())),
            config_crc=self.config_crc,
        )

    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "pools": dict(self.available)}

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return model_list(self.model_name)

    async def _prepare(self, request: Request, kind: type):
        self.mark_received()
        check_api_key(self.api_key, request)
        req = validate(kind, await read_json(request, self.config.server.max_body_bytes))
        check_model_name(req.model, self.model_name)
        header = request.headers.get("x-priority")
        tier = request_tier(req.priority, header, req.service_tier, self.default_tier)
        return req, tier

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        req, tier = await self._prepare(request, p.CompletionRequest)
        return await self._held_answer(req, tier, lambda: self._encode_prompt(req.prompt), None)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        req, tier = await self._prepare(request, p.ChatCompletionRequest)
        plan = tools.plan_for(req)
        return await self._held_answer(req, tier, lambda: self._encode_chat(req, plan), plan)

    async def _held_answer(self, req, tier: str, encode, plan: tools.ToolPlan | None):
        """`_answer` within the lower tiers' share of the ingress (serving/llm/tier_share.py):
        past it a 429 before the prompt is even tokenized."""
        hold = self.tier_share.take(tier)
        if hold is None:
            share = self.tier_share
            raise ApiError(
                429,
                f"server is saturated: {tier}: the ingress already holds {share.held} "
                f"analytical and offline requests, their share of its slots",
                type_="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after_s=self.config.server.retry_after_s,
            )
        try:
            response = await self._answer(req, tier, encode(), plan, hold)
        except BaseException:
            hold.release()
            raise
        if not isinstance(response, StreamingResponse):  # a stream releases when it ends
            hold.release()
        return response

    async def _answer(
        self, req, tier: str, ids: list[int], plan: tools.ToolPlan | None, hold: Hold | None = None
    ):
        """The shared path of both endpoints: n choices, streamed or collected. A stream
        releases `hold` when it ends (HTTP requests only; the batch lane has none)."""
        grammar = None if plan is None else tools.grammar_for(plan)
        if grammar is not None:
            grammar = self._checked_grammar(grammar, "tools")
        opened = await self._open_choices(
            ids, self._params(req, len(ids), grammar), tier, req.num_choices
        )
        reply = Reply(
            rid=p.new_id("chatcmpl" if isinstance(req, p.ChatCompletionRequest) else "cmpl"),
            model=self.model_name,
            req=req,
            states=[ChoiceState(i, plan) for i in range(len(opened))],
            token_text=self.token_text,
            extra=service_tier_echo(req.service_tier, tier),
            echo=self._echo_text(req),
        )
        relays = [self._relay(o, req.stop) for o in opened]
        if req.stream:
            frames = self._stream(reply, merge_streams(relays), hold)
            if hold is not None:  # a stream that never starts never runs its finally
                weakref.finalize(frames, hold.release)
            return StreamingResponse(frames, media_type="text/event-stream")
        try:
            await asyncio.gather(*(drain(r, s) for r, s in zip(relays, reply.states, strict=True)))
        except Exception as err:  # the replica died mid-generation: a clean 503, not a bare 500
            log.warning("generation failed: %s", type(err).__name__)
            raise ApiError(
                503,
                "the replica serving this request failed mid-generation; retry",
                type_="server_error",
                code="replica_failed",
                retry_after_s=self.config.server.retry_after_s,
            ) from None
        return reply.response()

    def _echo_text(self, req) -> str:
        if not isinstance(req, p.CompletionRequest) or not req.echo:
            return ""
        prompt = req.prompt
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)

    async def _stream(self, reply: Reply, items, hold: Hold | None = None) -> AsyncIterator[str]:
        # One write per replica message: a delta's frames (content, tool calls, finish) are
        # encoded and sent together, the opening frames with the first delta. `hold` comes back
        # once the replica's items end, fail or the client leaves.
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
