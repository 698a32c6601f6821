"""LLMEngine: requests in, tokens out. `step()` is schedule -> run -> postprocess.

Threading: `add_request` and `abort` only validate and append to an inbox (a deque, whose append
and popleft are atomic), which `step()` drains first. So the async driver can run steps in a worker
thread while the event loop keeps accepting requests, and the scheduler is touched by one thread.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as Seq
from dataclasses import replace

import torch

from serving.engine import cpu_linear, loader, torch_thread
from serving.engine.build import StepTiming, build_kv
from serving.engine.config import EngineConfig
from serving.engine.driver import AsyncDriver
from serving.engine.grammar import GrammarCompiler
from serving.engine.lora import engine_ops
from serving.engine.lora.manager import LoraManager
from serving.engine.outputs import RequestOutput, StreamDelta
from serving.engine.runner import Runner
from serving.engine.sampler import make_generator
from serving.engine.sampling_params import SamplingParams
from serving.engine.scheduler import ScheduledBatch, Scheduler
from serving.engine.sequence import RequestId, Sequence, Tier
from serving.engine.stats import EngineStats, StatsTracker, engine_stats

Prompt = str | Seq[int]


class LLMEngine:
    def __init__(
        self,
        model,
        tokenizer=None,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # on the process's one torch thread, where the steps run (serving/engine/torch_thread.py)
        torch_thread.call(self._setup, model, tokenizer, config, clock)

    def _setup(self, model, tokenizer, config: EngineConfig | None, clock) -> None:
        cfg = config or EngineConfig()
        if cfg.device != "auto" or cfg.dtype != "auto":  # an explicit choice moves the model
            device = loader.resolve_device(cfg.device)
            dtype = loader.resolve_dtype(cfg.dtype, device, loader.saved_dtype(model))
            model = loader.load_model(model, dtype, device)
        # vLLM's engine `seed`: requests without their own seed draw from the process-wide RNG, so
        # seeding it here makes a replica's unseeded sampling repeatable run to run (one engine
        # per replica process, as in vLLM's workers).
        torch.manual_seed(cfg.seed)
        self.config = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.clock = clock
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cpu_linear = cpu_linear.pack_if_useful(model, cfg.cpu_linear, self.device, self.dtype)
        # Adapter slots before the KV budget is measured: on CUDA they come out of it.
        self.adapters = (
            LoraManager(model, cfg.max_loras, cfg.max_lora_rank) if cfg.max_loras else None
        )
        parts = build_kv(model, cfg, self.dtype, self.device, self.adapters)
        self.max_model_len = parts.max_model_len
        self.pool = parts.pool
        self.ledger = parts.ledger
        self.prefix_caching = parts.prefix_caching
        self.kv_cache = parts.kv_cache
        self.runner: Runner = parts.runner
        self.scheduler = Scheduler(cfg, self.ledger)
        self.eos_token_ids = loader.eos_token_ids(model, tokenizer)
        self.vocab_size = model.config.get_text_config().vocab_size
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size, self.eos_token_ids)
        self._inbox: deque[tuple[str, object]] = deque()
        self._live: set[str] = set()
        self._ids = itertools.count()
        self.tracker = StatsTracker()
        self.step_log: deque[StepTiming] = deque(maxlen=8192)
        self.loop_gaps_s: deque[float] = deque(maxlen=128)  # between busy steps (driver.py)
        self.num_arrivals = 0  # requests taken from the inbox, ever
        # Called after every step as observer.on_step(engine, now, step_s, batch, touched), on
        # the stepping thread (the concurrency tuner's window: serving/engine/tuning.py).
        self.observers: list = []
        # Called with each ScheduledBatch right after scheduling, before the forward (so
        # num_computed_tokens is still the context before the step), on the stepping thread
        # (capacity/calibrate.py records each step's KV reads).
        self.schedule_hooks: list[Callable[[ScheduledBatch], None]] = []
        self._configured_min_num_seqs = cfg.min_num_seqs
        self._driver = AsyncDriver(self)

    @classmethod
    def from_pretrained(
        cls,
        path_or_model,
        config: EngineConfig | None = None,
        tokenizer=None,
        trust_remote_code: bool = False,
        **kw,
    ) -> LLMEngine:
        """Load a model directory / hub id (already on disk), or wrap a loaded model.
        A directory's own modelling code runs only with trust_remote_code=True."""
        cfg = config or EngineConfig()
        model, tok = torch_thread.call(
            loader.load_checked, path_or_model, cfg, tokenizer, trust_remote_code
        )
        return cls(model, tok, cfg, **kw)

    # ----- requests ------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt is text but the engine has no tokenizer; pass token ids")
            return list(self.tokenizer(prompt).input_ids)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt token id {bad[0]} is out of range; allowed: 0 <= id < {self.vocab_size}"
            )
        return ids

    def _check_vocab(self, field: str, ids) -> None:
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            raise ValueError(
                f"{field}: token id {bad[0]} is out of range; allowed: 0 <= id < {self.vocab_size}"
            )

    def make_sequence(
        self,
        prompt: Prompt,
        params: SamplingParams | None,
        tier,
        request_id,
        timeout_s,
        adapter: str | None = None,
    ) -> Sequence:
        """Validate a request and build its Sequence; raises ValueError if it can never run."""
        params = params or SamplingParams()
        engine_ops.check_adapter(self.adapters, adapter)
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("prompt is empty; it must hold at least one token")
        want = len(ids) + (params.max_tokens or 0)
        if want > self.max_model_len or len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {want} tokens "
                f"exceeds max_model_len={self.max_model_len}; shorten the prompt or lower "
                "max_tokens"
            )
        self._check_vocab("logit_bias", [t for t, _ in params.logit_bias])
        self._check_vocab("stop_token_ids", params.stop_token_ids)
        now = self.clock()
        timeout_s = self.config.max_queue_wait_s if timeout_s is None else timeout_s
        seq = Sequence(
            request_id=RequestId(request_id or f"req-{next(self._ids)}"),
            token_ids=ids,
            params=params,
            tier=Tier.parse(tier),
            arrival_s=now,
            deadline_s=None if timeout_s is None else now + timeout_s,
            eos_token_ids=self.eos_token_ids,
            max_total_tokens=self.max_model_len,
            generator=make_generator(params, self.device),
            matcher=None if params.grammar is None else self.grammars.matcher(params.grammar),
            adapter=adapter,
        )
        need = self.ledger.reservation_for(seq)  # the most it holds at once, windows applied
        if need > self.pool.num_blocks:
            raise ValueError(
                f"request needs {need} KV blocks ({seq.max_len_tokens} tokens) but the whole KV "
                f"budget is {self.pool.num_blocks} blocks "
                f"({self.pool.num_blocks * self.pool.block_size_tokens} tokens); lower max_tokens "
                "or raise EngineConfig.kv_cache_bytes"
            )
        return seq

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        tier: str | Tier = "interactive",
        request_id: str | None = None,
        timeout_s: float | None = None,
        adapter: str | None = None,
    ) -> str:
        """Queue a request (of LoRA `adapter`, None: the base model); raises ValueError at once
        if it can never run. Returns its id."""
        seq = self.make_sequence(prompt, params, tier, request_id, timeout_s, adapter)
        self.submit(seq)
        return seq.request_id

    def submit(self, seq: Sequence) -> None:
        """Hand a validated sequence to the next step. Ids must be unique among live requests:
        the block pool keys block tables by id, so a duplicate would share (corrupt) one."""
        if seq.request_id in self._live:
            raise ValueError(f"request_id={seq.request_id!r} is already in flight")
        self._live.add(seq.request_id)
        self._inbox.append(("add", seq))
        self._driver.wake()

    # ----- LoRA adapters (serving/engine/lora/) ---------------------------------------------
    def add_adapter(self, name: str, path: str) -> None:
        """Register a PEFT LoRA adapter directory under `name` (validated now; loaded into a slot
        when a request needs it). ValueError naming the field when it cannot be served."""
        torch_thread.call(engine_ops.require(self.adapters).add, name, path)

    def remove_adapter(self, name: str) -> None:
        """Forget an adapter; ValueError if unknown or a queued or running request uses it."""
        torch_thread.call(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        live = [item for op, item in list(self._inbox) if op == "add"] + self.scheduler.running
        live += [s for queue in self.scheduler.waiting.values() for s in queue]
        engine_ops.remove_unused(self.adapters, self.ledger, live, name)  # type: ignore[arg-type]

    def abort(self, request_id: str) -> None:
        """Cancel a request and free everything it holds; takes effect at the next step."""
        self._inbox.append(("abort", request_id))
        self._driver.wake()

    def _drain_inbox(self) -> list[Sequence]:
        aborted: list[Sequence] = []
        while self._inbox:
            op, item = self._inbox.popleft()
            if op == "add":
                self.scheduler.add(item)  # type: ignore[arg-type]
                self.num_arrivals += 1
                continue
            seq = self.scheduler.abort(item)  # type: ignore[arg-type]
            if seq is not None:
                seq.finished_s = self.clock()
                aborted.append(seq)
        return aborted

    # ----- the step --------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """One engine iteration; returns every sequence that got a token, finished or failed."""
        return torch_thread.call(self._step)

    def _step(self) -> list[Sequence]:
        t0 = time.perf_counter()
        aborted = self._drain_inbox()
        batch = self.scheduler.schedule(self.clock())
        for hook in self.schedule_hooks:
            hook(batch)
        sampled = self.runner.run(batch) if batch.seqs else []
        advanced = self.scheduler.postprocess(batch, sampled, self.clock())
        touched = aborted + batch.timed_out + advanced
        self._account(batch, touched, len(sampled), time.perf_counter() - t0)
        return touched

    def _account(self, batch, touched: list[Sequence], num_sampled: int, step_s: float) -> None:
        now = self.clock()
        for seq in batch.admitted:
            self.tracker.record_admission(seq.arrival_s, seq.admitted_s, seq.tier.name.lower())
        self.tracker.num_preemptions += len(batch.preempted)
        self.tracker.num_timeouts += len(batch.timed_out)
        for seq in touched:
            if seq.finished:
                self.tracker.num_finished += 1
                if seq.first_token_s is not None:  # it generated: its length is a sample
                    self.tracker.record_output(seq.num_output_tokens)
                self.runner.release(seq.request_id)
                self._live.discard(seq.request_id)
        if batch.seqs:
            self.tracker.record_step(now, num_sampled)
            self.step_log.append(
                StepTiming(len(batch.seqs), batch.num_tokens, step_s, self.runner.last_forward_s)
            )
        for observer in self.observers:
            observer.on_step(self, now, step_s, batch, touched)

    def set_limits(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """Move the concurrency ceiling and the per-step token budget (the tuner's knobs); the
        next step schedules with them. The window's floor follows a ceiling set below it. One
        sequence's chunk stays within the ledger's chunk_tokens (the configured budget), which
        its reservations were sized for."""
        floor = min(self._configured_min_num_seqs, max_num_seqs)
        cfg = replace(
            self.config,
            max_num_seqs=max_num_seqs,
            min_num_seqs=floor,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        self.config = cfg
        self.scheduler.config = cfg

    @property
    def num_live_requests(self) -> int:
        """Requests submitted and not yet finished or aborted (0 when nothing leaked)."""
        return len(self._live)

    def has_unfinished(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_unfinished()

    # ----- public reads of the queues (snapshots: a step may be running on another thread) ----
    def running_requests(self) -> list[Sequence]:
        """The sequences admitted and not finished, in admission order (read only)."""
        return list(self.scheduler.running)  # list() copies in one C call under the GIL

    def waiting_requests(self, tier: Tier | None = None) -> list[Sequence]:
        """The queued sequences, interactive first, FIFO within a tier (read only); requests
        submitted since the last step are not in a queue yet (see stats().waiting_by_tier)."""
        tiers = list(Tier) if tier is None else [tier]
        return [seq for t in tiers for seq in list(self.scheduler.waiting[t])]

    def num_waiting(self, tier: Tier | None = None) -> int:
        return self.scheduler.num_waiting(tier)

    # ----- convenience front ends ----------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        tier: str | Tier = "interactive",
        adapters: str | Seq[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion (blocking). `params` and `adapters` (LoRA names, None: the
        base model) are one value or one per prompt."""
        if self._driver.running:
            raise RuntimeError("generate() drives the engine itself; use stream() while serving")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        plist = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params has {len(plist)} entries for {len(prompts)} prompts")
        alist = list(adapters) if isinstance(adapters, list | tuple) else [adapters] * len(prompts)
        if len(alist) != len(prompts):
            raise ValueError(f"adapters has {len(alist)} entries for {len(prompts)} prompts")
        seqs = [
            self.make_sequence(p, sp, tier, None, None, a)
            for p, sp, a in zip(prompts, plist, alist, strict=True)
        ]
        for seq in seqs:
            self.submit(seq)
        while any(not s.finished for s in seqs):
            self.step()
        return [self.output_of(s) for s in seqs]

    def stream(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        tier: str | Tier = "interactive",
        request_id: str | None = None,
        timeout_s: float | None = None,
        interval_s: float = 0.0,
        adapter: str | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """Async iterator of deltas of one request (of LoRA `adapter`; None: the base model).
        interval_s > 0 coalesces tokens after the first into one delta per interval."""
        return self._driver.stream(prompt, params, tier, request_id, timeout_s, interval_s, adapter)

    @property
    def loop_alive(self) -> bool:
        """False once the async loop died of an error (the replica's health check)."""
        return self._driver.alive

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def output_of(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=seq.output_token_ids,
            text=self.decode(seq.output_token_ids),
            finish_reason=seq.finish_reason or "",
            num_preemptions=seq.num_preemptions,
            queue_wait_s=None if seq.admitted_s is None else seq.admitted_s - seq.arrival_s,
            ttft_s=None if seq.first_token_s is None else seq.first_token_s - seq.arrival_s,
            latency_s=None if seq.finished_s is None else seq.finished_s - seq.arrival_s,
            error=seq.error,
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        )

    # ----- introspection -------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return engine_stats(self, self.clock())

    def waiting_by_tier(self) -> dict[str, int]:
        """Queued requests per tier, counting those submitted since the last step: admission
        decisions made between two steps must see each other, or a burst would all pass."""
        waiting = {t.name.lower(): self.scheduler.num_waiting(t) for t in Tier}
        for op, item in list(self._inbox):  # list() snapshots in one C call
            if op == "add":
                waiting[item.tier.name.lower()] += 1  # type: ignore[union-attr]
        return waiting

    def check_integrity(self) -> None:
        self.ledger.check_integrity()
