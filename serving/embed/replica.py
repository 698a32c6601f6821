"""EmbedReplica: the deployment of an embedding app (`model.task: embed`), HTTP and handle in one.

A single-pass model needs no separate ingress hop: each replica serves OpenAI `/v1/embeddings`
itself (Serve's proxy spreads HTTP requests over the replicas) and batches what it receives with
serving/embed/batch_loop.py. Every input of a request is queued on its own, so it batches with
inputs of similar length, possibly from other requests. Ready means warmed up: the constructor
embeds a self-check text alone and within a batch and refuses to start if the two differ.
"""

# No `from __future__ import annotations`: FastAPI must see the real `Request` annotation on the
# routes after serve.ingress rewrites them (as in serving/routes/ingress.py).
import asyncio
import logging
import math
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from ray import serve

from serving.api.embeddings import EmbeddingRequest, embedding_response
from serving.api.errors import ApiError, check_model_name
from serving.api.http import (
    api_key_from_env,
    check_api_key,
    install_error_handlers,
    model_list,
    read_json,
    request_tier,
    validate,
)
from serving.config import AppConfig
from serving.embed.batch_loop import BatchLoop, QueueFullError
from serving.engine.torch_thread import core_layout, node_cores

log = logging.getLogger("ray.serve")
embed_api = install_error_handlers(
    FastAPI(title="tideserve embeddings", docs_url=None, redoc_url=None)
)

SELF_CHECK_TEXTS = ("The capital of France is Paris.", "hi")


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What the handle API's `embed` returns: vectors in input order."""

    vectors: tuple[tuple[float, ...], ...]
    num_prompt_tokens: int
    model: str


class EmbedService:
    """The request path without Serve, so it can be driven from tests and benchmarks too."""

    def __init__(self, config: dict, metrics=None) -> None:
        import torch

        from serving.embed.model import EmbeddingModel
        from serving.model_source import resolve_model_dir, served_name_for

        self.config = AppConfig.from_args(config)
        if self.config.model.task != "embed":
            raise ValueError(f"model.task={self.config.model.task!r}; EmbedReplica needs 'embed'")
        rep = self.config.replica  # `auto`: floor(num_cpus) threads (>= 1), unpinned here
        torch.set_num_threads(core_layout(rep.torch_threads, rep.num_cpus, node_cores()).threads)
        started = time.monotonic()
        source = self.config.model.source
        self.model = EmbeddingModel.load(resolve_model_dir(source, task="embed"))
        self.model_name = self.config.model.served_name or served_name_for(source, "embed")
        self.metrics = metrics
        self.loop = BatchLoop(
            self._run,
            self.config.dynamic_batching,
            retry_after_s=self.config.server.retry_after_s,
            on_batch=self._on_batch,
            on_tune=metrics.tuned if metrics else None,
        )
        if metrics:
            metrics.knobs(self.loop.policy.target_size, self.loop.policy.window_s)
        self.self_check()
        self.warmup_s = time.monotonic() - started

    def self_check(self) -> None:
        ids = [self.model.tokenize(t) for t in SELF_CHECK_TEXTS]
        together = self.model.embed(ids)
        alone = [self.model.embed([x])[0] for x in ids]
        for a, b in zip(together, alone, strict=True):
            if not all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a, b, strict=True)):
                raise RuntimeError(
                    "self-check: a batched embedding differs from the same text alone"
                )

    async def _run(self, batch: list[list[int]]) -> list[list[float]]:
        return await asyncio.to_thread(self.model.embed, batch)

    def _on_batch(self, record) -> None:
        if self.metrics:
            self.metrics.batch(record, self.loop.num_waiting)

    async def embed(self, items: list[str | list[int]], lane: str = "interactive") -> Embeddings:
        """Vectors in input order and the prompt tokens they read; ApiError 400/429."""
        try:  # all or nothing: a half-queued request helps nobody
            self.loop.check_room(len(items))
        except QueueFullError as err:
            raise _too_many(err, len(items)) from None
        try:
            ids = [self.model.tokenize(item) for item in items]
        except ValueError as err:
            raise ApiError(400, f"input: {err}", param="input") from None
        arrived = time.monotonic()
        try:
            vectors = await asyncio.gather(*(self.loop.submit(x, len(x), lane) for x in ids))
        except QueueFullError as err:  # a burst raced us to the last places
            raise _too_many(err, len(items)) from None
        if self.metrics:
            self.metrics.latency(lane, time.monotonic() - arrived)
        return Embeddings(
            tuple(tuple(v) for v in vectors), sum(len(x) for x in ids), self.model_name
        )


def _too_many(err: QueueFullError, num_inputs: int) -> ApiError:
    return ApiError(
        429,
        f"{err} ({num_inputs} inputs asked)",
        type_="rate_limit_error",
        code="rate_limit_exceeded",
        retry_after_s=err.retry_after_s,
    )


@serve.ingress(embed_api)
class EmbedReplica:
    def __init__(self, config: dict) -> None:
        from serving.embed.metrics import BatchMetrics

        self.service = EmbedService(config, BatchMetrics())
        self.config = self.service.config
        self.api_key = api_key_from_env(self.config.server.api_key_env)
        log.info("embedding replica ready in %.1f s (%s)", self.service.warmup_s, self.model_name)

    @property
    def model_name(self) -> str:
        return self.service.model_name

    @embed_api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "model": self.model_name, "waiting": self.service.loop.num_waiting}

    @embed_api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return model_list(self.model_name)

    @embed_api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        req = validate(
            EmbeddingRequest, await read_json(request, self.config.server.max_body_bytes)
        )
        check_model_name(req.model, self.model_name)
        if req.dimensions is not None and req.dimensions != self.service.model.dim:
            raise ApiError(
                400,
                f"dimensions={req.dimensions}: {self.model_name} returns exactly "
                f"{self.service.model.dim} dimensions",
                param="dimensions",
            )
        lane = request_tier(req.priority, request.headers.get("x-priority"))
        out = await self.service.embed(req.items(), lane)
        return embedding_response(
            self.model_name, out.vectors, out.num_prompt_tokens, req.encoding_format
        )

    # ----- handle API (other Ray apps) -------------------------------------------------------
    async def embed(self, inputs: str | list, priority: str = "interactive") -> Embeddings:
        """The vectors of `inputs` in input order, with the prompt tokens they read."""
        req = validate(EmbeddingRequest, {"input": inputs, "priority": priority})
        return await self.service.embed(req.items(), req.priority or "interactive")

    def info(self) -> dict:
        loop = self.service.loop
        return {
            "model": self.model_name,
            "dim": self.service.model.dim,
            "max_input_tokens": self.service.model.max_tokens,
            "target_size": loop.policy.target_size,
            "window_s": loop.policy.window_s,
            "waiting": loop.num_waiting,
            "tuner_log": [(t, d.action, d.reason) for t, d in loop.tuner_log],
        }

    async def check_health(self) -> None:
        if not self.service.loop.alive():
            raise RuntimeError("batch loop died; replace this replica")
