"""HttpIngress: the LLM app's ingress deployment, composed of two parts, and all of its routes.

    self.ingress   the request path (serving/llm/ingress.py): tokenizer, tiers, pools, replies
    self.lane      the offline lane (serving/batch/lane.py), which runs batch lines through
                   self.ingress via IngressLaneHost (serving/routes/lane_host.py)
    self.batch_api the Batch API's HTTP answers on the lane (serving/routes/batch_api.py)
    self.adapter_api  vLLM's LoRA load/unload answers (serving/routes/adapters.py)

Routes: /health, /v1/models, /v1/completions, /v1/chat/completions, /v1/files..., /v1/batches...,
/v1/load_lora_adapter and /v1/unload_lora_adapter (serving/routes/adapters.py).
The handle API (generate, generate_stream) and the autoscaling reads are methods here too.

SSE frames are `data: <json>\\n\\n` and end with `data: [DONE]`; with
`stream_options.include_usage` a last chunk carries usage and no choices, as OpenAI sends it.
A failure after the stream started (a replica died) becomes an error event, never a hang.
"""

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from ray import serve

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import (
    check_api_key,
    install_error_handlers,
    model_list,
    read_json,
    request_tier,
    validate,
)
from serving.batch.lane import OfflineLane
from serving.config import AppConfig
from serving.llm import tools
from serving.llm.autoscaling_stats import IngressStats
from serving.llm.ingress import Ingress
from serving.llm.messages import Completion, Delta
from serving.routes.adapters import AdapterApi
from serving.routes.batch_api import BatchApi
from serving.routes.lane_host import IngressLaneHost, lane_limits

api = install_error_handlers(FastAPI(title="tideserve", docs_url=None, redoc_url=None))


# Decorated where it is defined: Serve rewrites the routes' `self` when the decorator runs, and a
# replica re-imports this module, so the rewrite must happen at import, not in build_app().
@serve.ingress(api)
class HttpIngress:
    def __init__(
        self, config: dict, hot, cold, lane: dict | None = None, config_crc: int = 0
    ) -> None:
        self.ingress = Ingress(config, hot, cold)
        # `lane`: the batch_api and controller sections (serving/app.py); the replicas' shared
        # config leaves them out, so changing them restarts no replica.
        lane_cfg = AppConfig.from_args(lane or {})
        ing = self.ingress
        limits = lane_limits(ing.config, lane_cfg.controller.replica_capacity_rps)
        host = IngressLaneHost(ing)
        self.lane = OfflineLane(lane_cfg.batch_api, limits, host, ing.app_name, ing.model_name)
        self.batch_api = BatchApi(self.lane, ing.api_key, ing.config.server.max_body_bytes)
        self.adapter_api = AdapterApi(
            ing.adapters, ing.handles, ing.available, ing.api_key, ing.config.server.max_body_bytes
        )
        self.config_crc = config_crc  # of the whole app config, for the autoscaling policy

    # ----- autoscaling (autoscaling/serve_policy.py, autoscaling/serve_io.py) ------------------
    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaling policy reads this (autoscaling/serve_policy.py)."""
        return self.autoscaling_stats().to_metrics()

    def autoscaling_stats(self) -> IngressStats:
        """The same numbers, typed: the opt-in controller actor reads them with a remote call
        (autoscaling/serve_io.py) and diffs the cumulative counts into rates."""
        return IngressStats(
            num_requests=self.ingress.num_requests,
            num_refused=self.ingress.num_refused,
            offline_cold_replicas=max(0, int(self.lane.cold_replicas_wanted())),
            config_crc=self.config_crc,
        )

    def set_pool_target(self, pool: str, target: int) -> None:
        self.ingress.set_pool_target(pool, target)

    # ----- handle API (other Ray apps) -----------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> Completion:
        """One completion: text, token ids, finish reason, token counts and the pool used."""
        return await self.ingress.generate(prompt, max_tokens, priority, **sampling)

    async def generate_stream(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> AsyncIterator[Delta]:
        async for item in self.ingress.generate_stream(prompt, max_tokens, priority, **sampling):
            yield item

    # ----- OpenAI routes ------------------------------------------------------------------------
    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "pools": dict(self.ingress.available)}

    @api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        check_api_key(self.ingress.api_key, request)
        return model_list(self.ingress.model_name, self.ingress.adapters.cards())

    @api.post("/v1/load_lora_adapter")
    async def load_lora_adapter(self, request: Request) -> Response:
        return await self.adapter_api.load(request)

    @api.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(self, request: Request) -> Response:
        return await self.adapter_api.unload(request)

    @api.post("/v1/completions")
    async def completions(self, request: Request):
        req, tier = await self._prepare(request, p.CompletionRequest)
        return await self._held_answer(req, tier, None)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        req, tier = await self._prepare(request, p.ChatCompletionRequest)
        return await self._held_answer(req, tier, tools.plan_for(req))

    async def _prepare(self, request: Request, kind: type):
        ing = self.ingress
        ing.mark_received()
        check_api_key(ing.api_key, request)
        req = validate(kind, await read_json(request, ing.config.server.max_body_bytes))
        ing.adapters.resolve(req.model)  # a 404 before tokenizing when no such model is served
        header = request.headers.get("x-priority")
        tier = request_tier(req.priority, header, req.service_tier, ing.default_tier)
        return req, tier

    async def _held_answer(self, req, tier: str, plan: tools.ToolPlan | None):
        """The answer within the lower tiers' share of the ingress (serving/llm/tier_share.py):
        past it a 429 before the prompt is even tokenized."""
        ing = self.ingress
        hold = ing.tier_share.take(tier)
        if hold is None:
            raise ApiError(
                429,
                f"server is saturated: {tier}: the ingress already holds {ing.tier_share.held} "
                f"analytical and offline requests, their share of its slots",
                type_="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after_s=ing.config.server.retry_after_s,
            )
        try:
            answer = await ing.answer(req, tier, ing.encode(req, plan), plan, hold)
        except BaseException:
            hold.release()
            raise
        if isinstance(answer, dict):  # a stream releases when it ends
            hold.release()
            return answer
        return StreamingResponse(answer, media_type="text/event-stream")

    # ----- the Batch API (serving/routes/batch_api.py) ------------------------------------------
    @api.post("/v1/files")
    async def upload_file(self, request: Request) -> dict:
        return await self.batch_api.upload_file(request)

    @api.get("/v1/files")
    async def list_files(self, request: Request) -> dict:
        return await self.batch_api.list_files(request)

    @api.get("/v1/files/{file_id}")
    async def retrieve_file(self, file_id: str, request: Request) -> dict:
        return await self.batch_api.retrieve_file(file_id, request)

    @api.get("/v1/files/{file_id}/content")
    async def file_content(self, file_id: str, request: Request) -> Response:
        return await self.batch_api.file_content(file_id, request)

    @api.delete("/v1/files/{file_id}")
    async def delete_file(self, file_id: str, request: Request) -> dict:
        return await self.batch_api.delete_file(file_id, request)

    @api.post("/v1/batches")
    async def create_batch(self, request: Request) -> dict:
        return await self.batch_api.create_batch(request)

    @api.get("/v1/batches")
    async def list_batches(self, request: Request) -> dict:
        return await self.batch_api.list_batches(request)

    @api.get("/v1/batches/{batch_id}")
    async def retrieve_batch(self, batch_id: str, request: Request) -> dict:
        return await self.batch_api.retrieve_batch(batch_id, request)

    @api.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, batch_id: str, request: Request) -> dict:
        return await self.batch_api.cancel_batch(batch_id, request)
