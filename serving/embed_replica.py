"""EmbedReplica: the deployment of an embedding app (`model.task: embed`), HTTP and handle in one.

A single-pass model needs no separate ingress hop: each replica serves OpenAI `/v1/embeddings`
itself (Serve's proxy spreads HTTP requests over the replicas) and batches what it receives with
serving/batch_loop.py. Every input of a request is queued on its own, so it batches with inputs
of similar length, possibly from other requests. Ready means warmed up: the constructor embeds
a self-check text alone and within a batch and refuses to start if the two differ.
"""

# No `from __future__ import annotations`: FastAPI must see the real `Request` annotation on the
# routes after serve.ingress rewrites them (as in serving/http.py).
import asyncio
import logging
import math
import os
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from ray import serve

from serving import protocol as p
from serving.batch_loop import BatchLoop, QueueFullError
from serving.config import AppConfig
from serving.embed_protocol import EmbeddingRequest, embedding_response
from serving.ingress import (
    api_error_response,
    check_api_key,
    read_json,
    validate,
    validation_error_response,
)

log = logging.getLogger("ray.serve")
embed_api = FastAPI(title="tideserve embeddings", docs_url=None, redoc_url=None)
embed_api.add_exception_handler(p.ApiError, api_error_response)
embed_api.add_exception_handler(RequestValidationError, validation_error_response)

SELF_CHECK_TEXTS = ("The capital of France is Paris.", "hi")


class EmbedService:
    """The request path without Serve, so it can be driven from tests and benchmarks too."""

    def __init__(self, config: dict, metrics=None) -> None:
        import torch

        from serving.embeddings import EmbeddingModel, resolve_embedding_dir, served_name_for

        self.config = AppConfig.from_args(config)
        if self.config.model.task != "embed":
            raise ValueError(f"model.task={self.config.model.task!r}; EmbedReplica needs 'embed'")
        torch.set_num_threads(self.config.replica.torch_threads)
        started = time.monotonic()
        source = self.config.model.source
        self.model = EmbeddingModel.load(resolve_embedding_dir(source))
        self.model_name = self.config.model.served_name or served_name_for(source)
        self.metrics = metrics
        self.loop = BatchLoop(
            self._run,
            self.config.batching,
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

    async def embed(self, items: list[str | list[int]], lane: str = "interactive") -> dict:
        """Vectors in input order and the prompt tokens they read; ApiError 400/429."""
        try:  # all or nothing: a half-queued request helps nobody
            self.loop.check_room(len(items))
        except QueueFullError as err:
            raise _too_many(err, len(items)) from None
        try:
            ids = [self.model.tokenize(item) for item in items]
        except ValueError as err:
            raise p.ApiError(400, f"input: {err}", param="input") from None
        arrived = time.monotonic()
        try:
            vectors = await asyncio.gather(*(self.loop.submit(x, len(x), lane) for x in ids))
        except QueueFullError as err:  # a burst raced us to the last places
            raise _too_many(err, len(items)) from None
        if self.metrics:
            self.metrics.latency(lane, time.monotonic() - arrived)
        return {"embeddings": list(vectors), "num_prompt_tokens": sum(len(x) for x in ids)}


def _too_many(err: QueueFullError, num_inputs: int) -> p.ApiError:
    return p.ApiError(
        429,
        f"{err} ({num_inputs} inputs asked)",
        type_="rate_limit_error",
        code="rate_limit_exceeded",
        retry_after_s=err.retry_after_s,
    )


@serve.ingress(embed_api)
class EmbedReplica:
    def __init__(self, config: dict) -> None:
        from serving.batch_metrics import BatchMetrics

        self.service = EmbedService(config, BatchMetrics())
        cfg = self.service.config
        key_env = cfg.server.api_key_env
        self.api_key = os.environ.get(key_env) if key_env else None
        if key_env and not self.api_key:
            raise ValueError(f"server.api_key_env={key_env!r} names an unset environment variable")
        self.config = cfg  # read_json reads the body cap from here
        log.info("embedding replica ready in %.1f s (%s)", self.service.warmup_s, self.model_name)

    @property
    def model_name(self) -> str:
        return self.service.model_name

    @embed_api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "model": self.model_name, "waiting": self.service.loop.num_waiting}

    @embed_api.get("/v1/models")
    async def models(self, request: Request) -> dict:
        check_api_key(self, request)
        card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "tideserve"}
        return {"object": "list", "data": [card]}

    @embed_api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> dict:
        check_api_key(self, request)
        req = validate(EmbeddingRequest, await read_json(self, request))
        p.check_model_name(req.model, self.model_name)
        if req.dimensions is not None and req.dimensions != self.service.model.dim:
            raise p.ApiError(
                400,
                f"dimensions={req.dimensions}: {self.model_name} returns exactly "
                f"{self.service.model.dim} dimensions",
                param="dimensions",
            )
        lane = req.priority or request.headers.get("x-priority") or "interactive"
        if lane not in p.TIERS:
            raise p.ApiError(
                400, f"priority={lane!r} is not one of {list(p.TIERS)}", param="priority"
            )
        out = await self.service.embed(req.items(), lane)
        return embedding_response(
            self.model_name, out["embeddings"], out["num_prompt_tokens"], req.encoding_format
        )

    # ----- handle API (other Ray apps) -------------------------------------------------------
    async def embed(self, inputs: str | list, priority: str = "interactive") -> dict:
        """{"embeddings": [[float]], "num_prompt_tokens": int, "model": name} in input order."""
        req = validate(EmbeddingRequest, {"input": inputs, "priority": priority})
        out = await self.service.embed(req.items(), req.priority or "interactive")
        return {**out, "model": self.model_name}

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
