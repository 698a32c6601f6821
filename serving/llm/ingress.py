"""Ingress: the LLM app's request path, shared by the OpenAI HTTP routes, the handle API and the
offline lane (serving/routes/ composes them into the Serve deployment).

It validates, counts tokens (it owns the tokenizer and chat template), classifies the tier
(`x-priority` header or `priority` field, default interactive), picks a pool
(serving/llm/dispatch.py) and relays the replica's token stream. Its public surface:

    encode(req, plan)        the prompt's token ids (completions: the prompt; chat: the template)
    answer(req, tier, ids)   n choices, collected (a dict) or streamed (SSE text)
    pool_view()              one replica's reading of each pool it routes to now (PoolView)
    adapters                 the LoRA adapters a request's `model` may name (llm/adapters.py)
    set_pool_target(...)     the forecast controller's announcement of a new target
    generate / generate_stream   the handle API (other Ray apps)
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
import weakref
from collections.abc import AsyncIterator

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import api_key_from_env, request_tier, validate
from serving.config import AppConfig
from serving.config.front_door import front_door
from serving.engine.grammar import GrammarCompiler
from serving.engine.sampling_params import SamplingParams
from serving.llm import tools
from serving.llm.adapters import AdapterRegistry
from serving.llm.arrivals import WaitBound
from serving.llm.choices import ChoiceState, TokenText
from serving.llm.dispatch import OpenStream, RefusalMemo, open_stream
from serving.llm.messages import AdapterRef, Completion, Delta, GenerateRequest
from serving.llm.pool_watch import PoolView, PoolWatch
from serving.llm.replies import Reply, drain, merge_streams, service_tier_echo, sse_stream
from serving.llm.request_params import HANDLE_SAMPLING_KEYS, RequestParams, choice_params
from serving.llm.stop_strings import StopStrings
from serving.llm.tier_share import Hold, TierShare
from serving.llm.tools import ToolPlan
from serving.llm.ttft_margin import TtftMargins
from serving.serve_status import app_name_or_default

log = logging.getLogger("ray.serve")
# When the ingress began handling the current request (set by the HTTP routes): the time it
# spends before dispatch counts against the request's TTFT budget at admission.
RECEIVED_S: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "received_s", default=None
)
# What answer() returns: the OpenAI response body, or the SSE text of a streamed reply.
Answer = dict | AsyncIterator[str]
OpenAIRequest = p.CompletionRequest | p.ChatCompletionRequest


class Ingress:
    def __init__(self, config: dict, hot, cold) -> None:
        from transformers import AutoTokenizer

        from serving.model_source import resolve_model_dir, served_name_for

        self.config = AppConfig.from_args(config)
        model_dir = resolve_model_dir(self.config.model.source)
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(model_dir), trust_remote_code=self.config.model.trust_remote_code
        )
        self.model_name = self.config.model.served_name or served_name_for(self.config.model.source)
        self.adapters = AdapterRegistry(
            self.model_name, self.config.model.adapters, self.config.engine.max_loras
        )
        # Checks grammars before dispatch; EOS and vocabulary do not change whether one compiles.
        grammars = GrammarCompiler(self.tokenizer, len(self.tokenizer), ())
        grammars.warm()
        self.request_params = RequestParams(self.config, grammars)
        self.token_text = TokenText(self.tokenizer)
        self.api_key = api_key_from_env(self.config.server.api_key_env)
        self.default_tier = self.config.server.service_tier_default
        self.app_name = app_name_or_default()
        fingerprint = self.config.replica_fingerprint()
        self.pools = PoolWatch({"hot": hot, "cold": cold}, fingerprint, self.app_name)
        # The dispatcher reads these two (the watcher keeps `available` in step with the pools).
        self.handles, self.available = self.pools.handles, self.pools.available
        tiers, srv = self.config.tiers, self.config.server
        # The replicas' TTFT rule, applied to each pool's last refused load (dispatch.py).
        slos = {name: (t.ttft_p99_s, t.ttft_admit_fraction) for name, t in tiers.items()}
        self.refusals = RefusalMemo(slos, srv.retry_after_max_s)
        self.margins = TtftMargins()
        self.wait_bound = WaitBound()  # no standing queue under overload (arrivals.py)
        self.tier_share = TierShare(front_door(self.config).lower_tier_slots)
        self.num_requests = 0  # requests that reached pool choice; read by the forecast controller
        self.num_refused = 0  # of those, latency-tier requests every pool refused (429)

    # ----- pools ---------------------------------------------------------------------------------
    async def ensure_watching(self) -> None:
        """The first request waits for the watcher's first poll (serving/llm/pool_watch.py)."""
        await self.pools.ensure_watching()

    async def pool_view(self) -> PoolView:
        return await self.pools.view()

    def set_pool_target(self, pool: str, target: int) -> None:
        self.pools.set_target(pool, target)

    def mark_received(self) -> None:
        """The HTTP routes call this first: from here on the request's time counts against its
        TTFT budget. (The ContextVar stays in this module: Serve pickles the routes by value.)"""
        RECEIVED_S.set(time.monotonic())

    # ----- the shared request path ---------------------------------------------------------------
    def encode(self, req: OpenAIRequest, plan: ToolPlan | None) -> list[int]:
        """The prompt's token ids: a completion's prompt, or the chat template's rendering."""
        if isinstance(req, p.ChatCompletionRequest):
            return self._encode_chat(req, plan)
        return self._encode_prompt(req.prompt)

    async def answer(
        self,
        req: OpenAIRequest,
        tier: str,
        ids: list[int],
        plan: ToolPlan | None,
        hold: Hold | None = None,
    ) -> Answer:
        """n choices, streamed (SSE text) or collected (the response body), of the base model or
        the adapter `req.model` names. A stream releases `hold` when it ends (HTTP requests
        only; the batch lane has none)."""
        adapter = self.adapters.resolve(req.model)
        grammar = None if plan is None else tools.grammar_for(plan)
        if grammar is not None:
            grammar = self.request_params.checked_grammar(grammar, "tools")
        params = self.request_params.params(req, len(ids), grammar)
        opened = await self._open_choices(ids, params, tier, req.num_choices, adapter)
        reply = Reply(
            rid=p.new_id("chatcmpl" if isinstance(req, p.ChatCompletionRequest) else "cmpl"),
            model=self.model_name if adapter is None else adapter.name,
            req=req,
            states=[ChoiceState(i, plan) for i in range(len(opened))],
            token_text=self.token_text,
            extra=service_tier_echo(req.service_tier, tier),
            echo=self._echo_text(req),
        )
        relays = [self._relay(o, req.stop) for o in opened]
        if req.stream:
            frames = sse_stream(reply, merge_streams(relays), hold)
            if hold is not None:  # a stream that never starts never runs its finally
                weakref.finalize(frames, hold.release)
            return frames
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

    def _echo_text(self, req: OpenAIRequest) -> str:
        if not isinstance(req, p.CompletionRequest) or not req.echo:
            return ""
        prompt = req.prompt
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)

    async def _open(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        tier: str,
        adapter: AdapterRef | None = None,
    ) -> OpenStream:
        self.num_requests += 1
        await self.ensure_watching()
        now = time.monotonic()
        spent_s = now - (RECEIVED_S.get() or now)  # this request's time in the ingress so far
        self.wait_bound.arrived(tier, now)
        request = GenerateRequest(
            p.new_id("req"),
            tuple(prompt_ids),
            params,
            tier,
            spent_s=max(spent_s, 0.0),
            max_wait_s=self.wait_bound.max_wait_s(tier, now),
            adapter=adapter,
        )
        try:
            opened = await open_stream(
                self.handles,
                self.available,
                request,
                self.config.server.retry_after_s,
                self.refusals,
                now,
                self.margins,
                time.time(),
            )
        except ApiError as err:
            if err.status == 429:
                self.wait_bound.refused(tier, now)
                # offline work waits for idle replicas by design: its refusals ask for nothing
                self.num_refused += tier != "offline"
            raise
        predicted_s = opened.first.predicted_ttft_s
        if predicted_s is not None:  # what the replica could not see (serving/llm/ttft_margin.py)
            done = time.monotonic()
            self.margins.observe(opened.pool, done - now - predicted_s, done)
        return opened

    async def _open_choices(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        tier: str,
        n: int,
        adapter: AdapterRef | None = None,
    ) -> list[OpenStream]:
        """One stream per choice, opened together (each waits for its first token). If one is
        refused, the others are cancelled (their KV freed) and the refusal stands for all."""
        if n == 1:
            return [await self._open(prompt_ids, params, tier, adapter)]
        results = await asyncio.gather(
            *(self._open(prompt_ids, cp, tier, adapter) for cp in choice_params(params, n)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if isinstance(r, OpenStream):
                    r.cancel()
            raise errors[0]
        return list(results)

    async def _relay(self, opened: OpenStream, stops: list[str]) -> AsyncIterator[Delta]:
        """Replica deltas with stop strings applied; cancels the replica stream on exit."""
        cut = StopStrings(stops)
        item = opened.first
        try:
            while True:
                text = cut.feed(item.text, item.finished)
                if cut.stopped:
                    yield dataclasses.replace(item, text=text, finished=True, finish_reason="stop")
                    return
                yield dataclasses.replace(item, text=text) if text != item.text else item
                if item.finished:
                    return
                item = await opened.rest.__anext__()
        finally:
            if not item.finished:  # client gone or stop string hit: free the KV now
                opened.cancel()

    def _encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        return list(prompt)

    def _encode_chat(self, req: p.ChatCompletionRequest, plan: ToolPlan | None) -> list[int]:
        """The chat template renders the turns (tool calls and tool results included); tools go
        in as `tools=` where the template renders them, else as a system message."""
        template = self.tokenizer.chat_template or ""
        native = "tools" in template
        turns = tools.render_turns(req.messages, plan, native)
        extra = {"tools": tools.tools_kwarg(plan)} if native and plan is not None else {}
        try:
            text = self.tokenizer.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False, **extra
            )
        except Exception as err:  # jinja's TemplateError, or a template that raises itself
            raise ApiError(
                400, f"messages: the model's chat template refused them: {err}", param="messages"
            ) from None
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    # ----- handle API (other Ray apps) ------------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> Completion:
        """One completion: text, token ids, finish reason, token counts and the pool used."""
        parts = [d async for d in self.generate_stream(prompt, max_tokens, priority, **sampling)]
        last = parts[-1]
        return Completion(
            text="".join(d.text for d in parts),
            token_ids=tuple(t for d in parts for t in d.token_ids),
            finish_reason=last.finish_reason or "stop",
            num_prompt_tokens=last.num_prompt_tokens,
            num_output_tokens=last.num_output_tokens,
            pool=last.pool,
        )

    async def generate_stream(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        priority: str = "interactive",
        **sampling,
    ) -> AsyncIterator[Delta]:
        unknown = sorted(set(sampling) - HANDLE_SAMPLING_KEYS)
        if unknown:  # HTTP ignores unknown fields (SDK upgrades); a Python caller made a typo
            raise ApiError(
                400,
                f"unknown argument(s) {unknown}; allowed: {sorted(HANDLE_SAMPLING_KEYS)}",
                param=unknown[0],
            )
        body = {"prompt": prompt, "max_tokens": max_tokens, "priority": priority, **sampling}
        req = validate(p.CompletionRequest, body)
        adapter = self.adapters.resolve(req.model)
        tier = request_tier(req.priority, None, req.service_tier, self.default_tier)
        ids = self._encode_prompt(req.prompt)
        opened = await self._open(ids, self.request_params.params(req, len(ids)), tier, adapter)
        async for item in self._relay(opened, req.stop):
            yield item
