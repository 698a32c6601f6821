"""ModelReplica: one engine per replica; the hot and cold groups are this one class, one config.

Ready means warmed up (R10): the constructor loads weights and runs a self-check generation
before it returns, and Serve only routes to replicas whose constructor finished. check_health
fails once the engine loop has died. Scale-down drains: Serve stops routing new requests to a
replica it is stopping and waits up to graceful_shutdown_timeout_s for in-flight streams.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator

from serving.config import AppConfig
from serving.engine import LLMEngine, RequestTimeoutError, SamplingParams, torch_thread
from serving.engine.core_fence import fence_node
from serving.engine.load import load_snapshot
from serving.llm.admission import AdmissionLimits, admit, max_in_replica, ttft_budget_s
from serving.llm.autoscaling_stats import ReplicaStats
from serving.llm.messages import (
    AdapterRef,
    Delta,
    Failure,
    GenerateRequest,
    Refusal,
    ReplicaInfo,
    ReplicaItem,
    ReplicaReading,
    ReplicaReport,
)
from serving.llm.replica_adapters import AdapterBusy, ReplicaAdapters
from serving.llm.request_latency import RequestLatency
from serving.llm.slow_start import SLOW_START_KEY, slow_start_fraction
from serving.llm.startup import StartupClock

log = logging.getLogger("ray.serve")

SELF_CHECK_PROMPT = "The capital of France is"
# Set to "1" in a deployment's runtime_env to make its replicas fail warm-up (tests of R10: a
# replica that fails its self-check must never receive traffic).
FAIL_SELF_CHECK_ENV = "TIDESERVE_FAIL_SELF_CHECK"


class ModelReplica:
    def __init__(self, config: dict, pool: str) -> None:
        from serving.llm.metrics import ReplicaMetrics
        from serving.llm.monitor import ReplicaMonitor
        from serving.model_source import resolve_model_dir, served_name_for

        clock = StartupClock()
        self.config = AppConfig.from_args(config)
        self.pool = pool
        rep = self.config.replica
        # Decision 10: threads from the node's cores, pinned where the replica holds the node.
        self.core_layout = torch_thread.core_layout(
            rep.torch_threads, rep.num_cpus, torch_thread.node_cores()
        )
        torch_thread.apply_layout(self.core_layout)
        if self.core_layout.pinned:  # the node's proxy, ingress and Ray off the model cores
            fence_node(self.core_layout.model_cores, self.core_layout.other_cores)
        if self.config.replica.num_gpus == 0 and self.config.replica.cpu_nice_increment:
            # The front door runs first; before loading, so that a replica starting beside a
            # serving one does not take the CPU from it either.
            os.nice(self.config.replica.cpu_nice_increment)
        clock.mark("setup")
        path = resolve_model_dir(self.config.model.source)
        clock.mark("resolve")
        self.engine = LLMEngine.from_pretrained(
            path, self.config.engine, trust_remote_code=self.config.model.trust_remote_code
        )
        # LoRA adapters: the declared ones now, loaded ones on first use (llm/replica_adapters.py)
        self.adapters = ReplicaAdapters(self.engine, self.config.model.adapters)
        clock.mark("load")
        self.self_check()
        clock.mark("self_check")
        self.engine.grammars.warm()  # ~0.5 s for a 49k vocabulary, once, before traffic
        clock.mark("warm")
        self.startup = clock.phases()
        self.warmup_s = self.startup.total_s
        self.ready_s = time.monotonic()  # slow start counts from here (llm/slow_start.py)
        model = self.config.model
        self.metrics = ReplicaMetrics(pool, model.served_name or served_name_for(model.source))
        # The step window doctor reads, the concurrency tuner, NVML samples (llm/monitor.py).
        self.monitor = ReplicaMonitor(self.engine, self.config, self.metrics, time.monotonic())
        self.reporter = _controller_reporter(pool)
        self.metrics.record_startup(self.startup)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.startup.as_dict().items())
        kernels = (  # what serving/engine chose on this machine (cpu_linear, decode_attention)
            f"linear {self.engine.cpu_linear}, decode attention "
            f"{getattr(self.engine.runner, 'decode_attention', 'model')}"
        )
        log.info(
            "%s replica ready in %.1f s (%s; model %s, %s; %s)",
            pool,
            self.warmup_s,
            phases,
            path,
            self.core_layout,
            kernels,
        )

    def self_check(self) -> None:
        """Generate a few tokens end to end; a replica that cannot is never marked ready."""
        if os.environ.get(FAIL_SELF_CHECK_ENV) == "1":  # fault injection for the hardening tests
            raise RuntimeError(f"self-check failed: injected by {FAIL_SELF_CHECK_ENV}=1")
        params = SamplingParams(max_tokens=self.config.replica.warmup_max_tokens, temperature=0)
        (out,) = self.engine.generate([SELF_CHECK_PROMPT], params)
        if not out.token_ids or out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"self-check generation failed: {out}")
        self.engine.check_integrity()
        self.engine.tracker.clear()  # the self-check is not traffic (its wait is start-up time)

    # ----- control plane -------------------------------------------------------------------
    def fingerprint(self) -> str:
        return self.config.replica_fingerprint()

    def info(self) -> ReplicaInfo:
        stats = self.engine.stats()
        return ReplicaInfo(
            pool=self.pool,
            fingerprint=self.fingerprint(),
            warmup_s=self.warmup_s,
            startup=self.startup,
            max_model_len=self.engine.max_model_len,
            kv_blocks_total=stats.num_kv_blocks_total,
            kv_blocks_used=stats.num_kv_blocks_used,
            kv_blocks_reserved=stats.num_kv_blocks_reserved,
            running=stats.num_running,
            waiting=stats.num_waiting,
            live_requests=self.engine.num_live_requests,
            pid=os.getpid(),
            slow_start_fraction=self._slow_start_fraction(),
        )

    def reading(self) -> ReplicaReading:
        """What `tideserve doctor` reads: config, KV ledger, the last step window."""
        replica_id = self.reporter.replica_id if self.reporter is not None else str(os.getpid())
        return self.monitor.reading(self.pool, replica_id, self.fingerprint())

    async def load_adapter(self, ref: AdapterRef) -> Failure | None:
        """Register an adapter the ingress is asked to load (POST /v1/load_lora_adapter): None,
        or a Failure saying why it cannot be served (the ingress answers it as a 400)."""
        try:
            await self.adapters.ensure(ref)
        except AdapterBusy as err:
            return Failure(409, f"adapter {ref.name!r}: {err}")
        except (ValueError, OSError) as err:
            return Failure(400, f"adapter {ref.name!r} at {ref.path!r} cannot be served: {err}")
        return None

    async def check_health(self) -> None:
        if not self.engine.loop_alive:
            raise RuntimeError("engine loop died; replace this replica")

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Queue signals for Serve's autoscaling policy (the emergency path of R9)."""
        stats = self.engine.stats()
        return ReplicaStats(
            num_waiting=stats.num_waiting,
            num_running=stats.num_running,
            queue_wait_p99_s=stats.queue_wait_p99_s,
            kv_use_fraction=stats.kv_use_fraction,
            window_requests=self.monitor.window_requests,
            lora_load_s=self.monitor.lora_window.load_s,
        ).to_metrics()

    def record_routing_stats(self) -> dict:
        from serving.llm.router import routing_stats_from_engine

        stats = self.engine.stats()
        self.metrics.update_engine(stats, self._avg_seq_len())
        self.monitor.tick(time.monotonic())
        if self.reporter is not None:  # the forecast controller's queue signals (R9 emergency)
            self.reporter.report(
                ReplicaReport(
                    pool=self.pool,
                    replica_id=self.reporter.replica_id,
                    num_waiting=stats.num_waiting,
                    num_running=stats.num_running,
                    queue_wait_p99_s=stats.queue_wait_p99_s,
                    kv_use_fraction=stats.kv_use_fraction,
                    window_requests=self.monitor.window_requests,
                    lora_load_s=self.monitor.lora_window.load_s,
                )
            )
        routing = routing_stats_from_engine(stats, queued_tokens=self._queued_tokens())
        routing[SLOW_START_KEY] = self._slow_start_fraction()
        return routing

    def _slow_start_fraction(self) -> float:
        age_s = time.monotonic() - self.ready_s
        return slow_start_fraction(age_s, self.config.replica.slow_start_s)

    def _queued_tokens(self) -> int:
        """KV tokens the waiting requests will claim: prompt + max_tokens where admission
        reserves that much, the prompt alone where blocks come on demand."""
        reserve = self.config.engine.kv_mode == "reserve"
        total = 0
        for seq in self.engine.waiting_requests():  # a snapshot: a step may be running
            total += seq.max_len_tokens if reserve else seq.num_prompt_tokens
        return total

    def _avg_seq_len(self) -> float:
        running = self.engine.running_requests()
        return sum(s.num_tokens for s in running) / len(running) if running else 0.0

    # ----- data plane ------------------------------------------------------------------------
    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[ReplicaItem]:
        """A Refusal, a Failure, or Deltas until one is finished; the first item decides."""
        if request.adapter is not None:  # registered here before its first request (lazily)
            refused = await self._ensure_adapter(request.adapter)
            if refused is not None:
                yield refused
                return
        tier = request.tier
        tier_cfg = self.config.tiers[tier]
        now = time.monotonic()
        hop_s = request.hop_s(time.time())
        stats = self.engine.stats()
        load = load_snapshot(self.engine, now, stats.concurrency_limit)
        limits = AdmissionLimits(
            ttft_budget_s=ttft_budget_s(
                tier_cfg.ttft_p99_s,
                tier_cfg.ttft_admit_fraction,
                request.spent_s + hop_s,
                request.ttft_margin_s,
            ),
            max_waiting=tier_cfg.max_waiting,
            offline_idle_fraction=self.config.engine.offline_idle_fraction,
            max_in_replica=max_in_replica(tier, self.config.replica.max_ongoing_requests),
            retry_after_max_s=self.config.server.retry_after_max_s,
            max_wait_s=request.max_wait_s,
        )
        decision = admit(stats, load, tier, len(request.prompt_token_ids), limits, now)
        if not decision.admitted:
            self.metrics.count_request("refused")
            self.monitor.num_refused += 1
            yield Refusal(
                f"{self.pool}: {decision.reason}",
                decision.retry_after_s,
                tier,
                decision.predicted_ttft_s,
                load,
            )
            return
        outcome = ["aborted"]  # until the stream ends: a caller that leaves aborts it
        try:
            async for item in self._relay(
                request, tier_cfg, outcome, hop_s + decision.predicted_ttft_s
            ):
                yield item
        finally:
            self.metrics.count_request(outcome[0])

    async def _ensure_adapter(self, ref: AdapterRef) -> Refusal | Failure | None:
        try:
            await self.adapters.ensure(ref)
        except AdapterBusy as err:  # its previous registration still serves running requests
            self.metrics.count_request("refused")
            return Refusal(f"{self.pool}: adapter {ref.name!r}: {err}", 1.0)
        except (ValueError, OSError) as err:
            self.metrics.count_request("invalid")
            return Failure(400, f"adapter {ref.name!r} at {ref.path!r} cannot be served: {err}")
        return None

    async def _relay(
        self, request: GenerateRequest, tier_cfg, outcome: list[str], predicted_ttft_s: float
    ):
        clock = RequestLatency(self.metrics, request.tier, time.monotonic())
        first = True
        try:
            stream = self.engine.stream(
                list(request.prompt_token_ids),
                request.params,
                tier=request.tier,
                request_id=request.request_id,
                timeout_s=request.timeout_s or tier_cfg.max_queue_wait_s,
                interval_s=self.config.replica.stream_interval_s,
                adapter=None if request.adapter is None else request.adapter.name,
            )
            async for delta in stream:
                if first:
                    clock.first_token(time.monotonic(), delta.queue_wait_s)
                    self.metrics.count_tokens(delta.num_prompt_tokens, 0)
                self.metrics.count_tokens(0, len(delta.token_ids))
                if delta.finished:  # recorded before the last yield: the caller may not resume
                    outcome[0] = "ok"
                    clock.end(time.monotonic(), delta.finish_reason or "stop")
                yield Delta(
                    text=delta.text,
                    token_ids=tuple(delta.token_ids),
                    finished=delta.finished,
                    finish_reason=delta.finish_reason,
                    num_prompt_tokens=delta.num_prompt_tokens,
                    num_output_tokens=delta.num_output_tokens,
                    pool=self.pool,
                    logprobs=tuple(delta.logprobs),
                    predicted_ttft_s=predicted_ttft_s if first else None,
                )
                first = False
        except ValueError as err:  # the engine refused the request as it is (too long, ...)
            outcome[0] = "invalid"
            clock.end(time.monotonic(), "invalid")
            yield Failure(400, str(err))
        except RequestTimeoutError as err:
            outcome[0] = "timeout"
            clock.end(time.monotonic(), "timeout")
            yield Refusal(str(err), self.config.server.retry_after_s)
        except Exception:  # a dead engine loop, ...: the request still ended, and counts
            clock.end(time.monotonic(), "error")
            raise
        finally:  # GeneratorExit / CancelledError: the ingress cut a stop string or the client left
            clock.end(time.monotonic(), "cancelled")


def _controller_reporter(pool: str):
    """Pushes this replica's queue numbers to its app's forecast controller, if one runs."""
    from ray import serve

    from autoscaling.reporter import ControllerReporter

    try:
        ctx = serve.get_replica_context()
    except Exception:  # built outside Serve (unit tests): nobody to report to
        return None
    return ControllerReporter(ctx.app_name, pool, ctx.replica_id.unique_id)
