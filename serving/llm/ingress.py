"""Ingress: OpenAI-compatible HTTP (FastAPI through serve.ingress) and the handle API.

It validates, counts tokens (it owns the tokenizer and chat template), classifies the tier
(`x-priority` header or `priority` field, default interactive), picks a pool
(serving/llm/dispatch.py) and relays the replica's token stream.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import api_key_from_env, request_tier, validate
from serving.config import AppConfig
from serving.config.front_door import front_door
from serving.engine.grammar import GrammarCompiler, GrammarError
from serving.engine.sampling_params import GrammarSpec, SamplingParams
from serving.llm import tools
from serving.llm.arrivals import WaitBound
from serving.llm.choices import TokenText
from serving.llm.dispatch import OpenStream, RefusalMemo, open_stream
from serving.llm.messages import Completion, Delta, GenerateRequest
from serving.llm.stop_strings import StopStrings
from serving.llm.tier_share import TierShare
from serving.llm.tools import ToolPlan
from serving.llm.ttft_margin import TtftMargins
from serving.serve_status import app_name_or_default, running_replicas

log = logging.getLogger("ray.serve")
# When the ingress began handling the current request (set by the HTTP routes): the time it
# spends before dispatch counts against the request's TTFT budget at admission.
RECEIVED_S: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "received_s", default=None
)


class Ingress:
    def __init__(self, config: dict, hot, cold) -> None:
        from transformers import AutoTokenizer

        from serving.model_source import resolve_model_dir, served_name_for

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
        # Checks grammars before dispatch; EOS and vocabulary do not change whether one compiles.
        self.grammars = GrammarCompiler(self.tokenizer, len(self.tokenizer), ())
        self.grammars.warm()
        self.token_text = TokenText(self.tokenizer)
        self.api_key = api_key_from_env(self.config.server.api_key_env)
        self.default_tier = self.config.server.service_tier_default
        self.fingerprint = self.config.replica_fingerprint()
        self.verified: dict[str, bool] = {}
        tiers, srv = self.config.tiers, self.config.server
        # The replicas' TTFT rule, applied to each pool's last refused load (dispatch.py).
        slos = {name: (t.ttft_p99_s, t.ttft_admit_fraction) for name, t in tiers.items()}
        self.refusals = RefusalMemo(slos, srv.retry_after_max_s)
        self.margins = TtftMargins()
        self.wait_bound = WaitBound()  # no standing queue under overload (arrivals.py)
        self.tier_share = TierShare(front_door(self.config).lower_tier_slots)
        self.app_name = app_name_or_default()
        self._watcher: asyncio.Task | None = None
        self._first_poll: asyncio.Task | None = None  # the poll a fresh ingress's requests await
        self.num_requests = 0  # requests that reached pool choice; read by the forecast controller
        self.num_refused = 0  # of those, latency-tier requests every pool refused (429)
        self.emptying: set[str] = set()  # pools the forecast controller is scaling to zero

    # ----- pools ---------------------------------------------------------------------------------
    async def _watch_pools(self, first_poll: asyncio.Future, period_s: float = 2.0) -> None:
        """Keep `available` in step with the pools: cold is used only while it has a running
        replica (an empty pool would park requests until one appears); either pool is refused
        outright if its replicas report another config fingerprint than the ingress's (R9)."""
        await asyncio.shield(first_poll)
        while True:
            await asyncio.sleep(period_s)
            await self._poll_pools()

    async def _poll_pools(self) -> None:
        try:
            counts = await asyncio.to_thread(running_replicas, self.app_name)
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
        """The first request waits for one poll, so a fresh ingress does not answer 503.

        One watcher per ingress: the check and the start have no await between them, so the
        requests of a first burst share one poll and one watcher. (With the poll awaited before
        the start, each request of the burst started a watcher of its own; after 16 concurrent
        first requests, 16 watchers called serve.status(), tens of ms of CPU each, 8 times a
        second: half a core of a 2-core machine, at idle.)"""
        if self._watcher is None or self._watcher.done():
            loop = asyncio.get_running_loop()
            self._first_poll = loop.create_task(self._poll_pools())
            self._watcher = loop.create_task(self._watch_pools(self._first_poll))
        # shielded: a request that goes away must not cancel the poll the others wait for
        await asyncio.shield(self._first_poll)

    # ----- shared request path ----------------------------------------------------------------
    def _params(
        self, req: p._SamplingFields, num_prompt_tokens: int, grammar=None
    ) -> SamplingParams:
        """The engine's SamplingParams of a validated request (OpenAI's defaults where unset)."""
        srv = self.config.server
        limit = self.config.engine.max_model_len
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            room = (limit - num_prompt_tokens) if limit else srv.default_max_tokens
            max_tokens = max(1, min(srv.default_max_tokens, room))
        elif max_tokens > srv.max_tokens_limit:
            raise ApiError(
                400,
                f"max_tokens={max_tokens} is out of range; allowed: 1 <= "
                f"max_tokens <= {srv.max_tokens_limit}",
                param="max_tokens",
            )
        source = req.grammar_source()
        if grammar is None and source is not None:
            grammar = self._checked_grammar(GrammarSpec(*source), "response_format")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0),
            min_p=req.min_p or 0.0,
            seed=req.seed,
            ignore_eos=bool(req.ignore_eos),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            logit_bias=tuple((int(k), v) for k, v in (req.logit_bias or {}).items()),
            logprobs=req.num_top_logprobs(),
            grammar=grammar,
        )

    def _checked_grammar(self, spec: GrammarSpec, field: str) -> GrammarSpec:
        """A grammar the library cannot compile is a 400 naming the problem, before dispatch."""
        try:
            self.grammars.check(spec)
        except GrammarError as err:
            raise ApiError(400, f"{field}: {err}", param=field) from None
        return spec

    def _choice_params(self, params: SamplingParams, n: int) -> list[SamplingParams]:
        """n choices are n sequences; a seeded request seeds choice i with seed + i, so the
        choices differ from each other and the whole reply repeats."""
        if n == 1 or params.seed is None:
            return [params] * n
        return [dataclasses.replace(params, seed=(params.seed + i) % 2**63) for i in range(n)]

    def set_pool_target(self, pool: str, target: int) -> None:
        """The forecast controller announces a new replica target before it applies it. A pool
        going to zero gets no new request from now on, not one status poll later: Serve's handle
        would park a request for an empty deployment until a replica comes back."""
        if target == 0 and pool != "hot":
            self.emptying.add(pool)
            self.available[pool] = False
        else:
            self.emptying.discard(pool)  # the watcher marks it available once a replica runs

    def mark_received(self) -> None:
        """The HTTP routes call this first: from here on the request's time counts against its
        TTFT budget. (The ContextVar stays in this module: Serve pickles the routes by value.)"""
        RECEIVED_S.set(time.monotonic())

    async def _open(self, prompt_ids: list[int], params: SamplingParams, tier: str) -> OpenStream:
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
        self, prompt_ids: list[int], params: SamplingParams, tier: str, n: int
    ) -> list[OpenStream]:
        """One stream per choice, opened together (each waits for its first token). If one is
        refused, the others are cancelled (their KV freed) and the refusal stands for all."""
        if n == 1:
            return [await self._open(prompt_ids, params, tier)]
        results = await asyncio.gather(
            *(self._open(prompt_ids, cp, tier) for cp in self._choice_params(params, n)),
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
        tier = request_tier(req.priority, None, req.service_tier, self.default_tier)
        ids = self._encode_prompt(req.prompt)
        opened = await self._open(ids, self._params(req, len(ids)), tier)
        async for item in self._relay(opened, req.stop):
            yield item


HANDLE_SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "ignore_eos",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "response_format",
        "service_tier",
    }
)
