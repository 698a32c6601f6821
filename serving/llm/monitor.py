"""A replica's periodic duties beside serving: the step window `doctor` reads, the concurrency
tuner, and the NVML samples of its GPUs.

`tick(now)` runs from the replica's `record_routing_stats`, which Serve calls every routing-stats
period (2 s): the tuner decides once per `engine.tuner_interval_s`, a step window closes every
WINDOW_S, GPUs are sampled every GPU_SAMPLE_S on replicas that hold one.
"""

from __future__ import annotations

import logging
import os
import time

from serving.engine.tuning import EngineTuner, TierSlo
from serving.engine.window import StepWindow, WindowSummary
from serving.llm.messages import LoraCounts, ReplicaReading

log = logging.getLogger("ray.serve")

WINDOW_S = 5.0
GPU_SAMPLE_S = 5.0
# Fault injection for the doctor's tests: every scheduled token adds this many seconds to a step,
# so a replica is compute-bound at any batch size (a saturated device).
STEP_DELAY_ENV = "TIDESERVE_STEP_DELAY_PER_TOKEN_S"


def tier_slos(config) -> dict[str, TierSlo]:
    return {name: TierSlo(t.ttft_p99_s, t.itl_p99_s) for name, t in config.tiers.items()}


class ReplicaMonitor:
    def __init__(self, engine, config, metrics, now: float) -> None:
        self.engine, self.config, self.metrics = engine, config, metrics
        self.window = StepWindow(now)
        engine.observers.append(self.window)
        self.last_window: WindowSummary | None = None
        self.num_refused = 0  # requests this replica turned away (admission), ever
        self._refused_at_window = 0
        self.refused_per_s = 0.0  # over the last closed window
        self._lora_at_window = LoraCounts()
        self.lora_window = LoraCounts()  # LoRA slot traffic over the last closed window
        self.gpus: tuple = ()
        self.tuner: EngineTuner | None = None
        if config.engine.tuner:
            self.tuner = EngineTuner(
                engine,
                tier_slos(config),
                now,
                interval_s=config.engine.tuner_interval_s,
                on_move=metrics.tuner_move,
            )
        self._next_window_s = now + WINDOW_S
        self._next_gpu_s = now
        _inject_step_delay(engine)

    def tick(self, now: float) -> None:
        if self.tuner is not None:
            self.tuner.maybe_tune(now)
        if now >= self._next_window_s:
            self._next_window_s = now + WINDOW_S
            self.last_window = self.window.take(now, self.engine)
            refused, self._refused_at_window = (
                self.num_refused - self._refused_at_window,
                self.num_refused,
            )
            self.refused_per_s = refused / max(self.last_window.span_s, 1e-9)
            lora = lora_counts(self.engine.stats())
            self.lora_window, self._lora_at_window = lora.minus(self._lora_at_window), lora
        if self.config.replica.num_gpus > 0 and now >= self._next_gpu_s:
            self._next_gpu_s = now + GPU_SAMPLE_S
            self.gpus = tuple(self.metrics.update_gpus())

    @property
    def window_requests(self) -> int:
        """Requests that got their first token in the last closed window (0 before one)."""
        return 0 if self.last_window is None else self.last_window.num_first_tokens

    def reading(self, pool: str, replica_id: str, fingerprint: str) -> ReplicaReading:
        engine, cfg = self.engine, self.engine.config
        stats = engine.stats()
        running = engine.running_requests()
        avg_len = sum(s.num_tokens for s in running) / len(running) if running else 0.0
        last = self.tuner.moves[-1][1] if self.tuner is not None and self.tuner.moves else None
        return ReplicaReading(
            pool=pool,
            replica_id=replica_id,
            fingerprint=fingerprint,
            config=self.config,
            kv_blocks_total=stats.num_kv_blocks_total,
            kv_blocks_used=stats.num_kv_blocks_used,
            kv_blocks_reserved=stats.num_kv_blocks_reserved,
            block_size_tokens=stats.block_size_tokens,
            kv_bytes_per_token=_kv_bytes_per_token(engine),
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            concurrency_limit=stats.concurrency_limit,
            num_running=stats.num_running,
            num_waiting=stats.num_waiting,
            avg_seq_len_tokens=avg_len,
            num_preemptions=stats.num_preemptions,
            num_timeouts=stats.num_timeouts,
            prefix_cache_query_tokens=stats.prefix_cache_query_tokens,
            prefix_cache_hit_tokens=stats.prefix_cache_hit_tokens,
            window=self.last_window,
            refused_per_s=self.refused_per_s,
            tuner_last=None if last is None else f"{last.action}: {last.reason}",
            gpus=self.gpus,
            lora_slots_total=stats.lora_slots_total,
            lora=lora_counts(stats),
            lora_window=self.lora_window,
        )


def lora_counts(stats) -> LoraCounts:
    """An engine snapshot's LoRA slot counters (each admission is a hit or a load)."""
    return LoraCounts(
        stats.num_lora_hits + stats.num_lora_loads,
        stats.num_lora_loads,
        stats.num_lora_evictions,
        stats.lora_load_s,
    )


def _kv_bytes_per_token(engine) -> int:
    from capacity.memory import kv_bytes_per_token

    return kv_bytes_per_token(engine.model.config, engine.dtype)


def _inject_step_delay(engine) -> None:
    delay = float(os.environ.get(STEP_DELAY_ENV, "0") or 0)
    if delay <= 0:
        return
    run = engine.runner.run

    def slowed(batch):
        time.sleep(delay * batch.num_tokens)
        return run(batch)

    engine.runner.run = slowed
    log.warning("%s=%s: every step sleeps %s s per scheduled token", STEP_DELAY_ENV, delay, delay)
