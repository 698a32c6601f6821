"""Engine statistics: a frozen snapshot and the small tracker that feeds it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common.stats import percentile
from common.tiers import Tier


@dataclass(frozen=True, slots=True)
class EngineStats:
    running_by_tier: dict[str, int]
    waiting_by_tier: dict[str, int]
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    num_kv_blocks_reserved: int
    block_size_tokens: int
    concurrency_limit: int
    tokens_per_s: float
    queue_wait_p50_s: float
    queue_wait_p99_s: float
    num_preemptions: int
    num_finished: int
    num_timeouts: int
    # Per tier: an interactive request is not delayed by an offline backlog (it is admitted
    # first), so its admission must not be judged by offline's long waits.
    queue_wait_p50_by_tier: dict[str, float] = field(default_factory=dict)
    # Prefix caching: blocks no request holds that keep their KV for reuse (evictable, not in
    # num_kv_blocks_used), and the prompt tokens looked up / found at admission, ever.
    num_kv_blocks_cached: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    # LoRA slots (serving/engine/lora/slots.py), ever: admissions whose adapter already held a
    # slot (hits), loads into a slot, and loads that first evicted another adapter (evictions).
    num_lora_hits: int = 0
    num_lora_loads: int = 0
    num_lora_evictions: int = 0
    lora_load_s: float = 0.0  # seconds the engine spent writing adapters into slots, ever
    lora_slots_total: int = 0
    lora_in_slots: tuple[str, ...] = ()  # adapters holding a slot now, sorted

    @property
    def num_running(self) -> int:
        return sum(self.running_by_tier.values())

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting_by_tier.values())

    @property
    def prefix_cache_hit_fraction(self) -> float:
        """Share of looked-up prompt tokens whose KV came from the cache (0 before any)."""
        q = self.prefix_cache_query_tokens
        return self.prefix_cache_hit_tokens / q if q else 0.0

    @property
    def kv_use_fraction(self) -> float:
        busy = max(self.num_kv_blocks_used, self.num_kv_blocks_reserved)
        return busy / self.num_kv_blocks_total


class StatsTracker:
    """Rolling windows of generated tokens and queue waits; time is always passed in."""

    def __init__(
        self, window_s: float = 10.0, max_waits: int = 2048, wait_window_s: float = 60.0
    ) -> None:
        self.window_s = window_s
        # The queue-wait percentiles cover admissions of the last wait_window_s only: they feed
        # the autoscaler's emergency test, and one slow admission long ago (a busy minute, the
        # replica's own start-up) must not read as a queue forever once traffic stops.
        self.wait_window_s = wait_window_s
        self._tokens: deque[tuple[float, int]] = deque()
        self._waits: deque[tuple[float, float]] = deque(maxlen=max_waits)  # (admitted at, wait)
        self._max_waits = max_waits
        self._waits_by_tier: dict[str, deque[tuple[float, float]]] = {}
        self._outputs: deque[int] = deque(maxlen=256)  # output tokens of recent finished requests
        self.num_preemptions = 0
        self.num_finished = 0
        self.num_timeouts = 0

    def record_step(self, now: float, num_new_tokens: int) -> None:
        self._tokens.append((now, num_new_tokens))
        while self._tokens and self._tokens[0][0] < now - self.window_s:
            self._tokens.popleft()

    def clear(self) -> None:
        """Forget everything measured so far (a replica's start-up self-check is not traffic)."""
        self.__init__(self.window_s, self._max_waits, self.wait_window_s)

    def record_admission(self, arrival_s: float, admitted_s: float, tier: str | None) -> None:
        wait_s = admitted_s - arrival_s
        self._waits.append((admitted_s, wait_s))
        if tier is not None:
            waits = self._waits_by_tier.setdefault(tier, deque(maxlen=self._max_waits))
            waits.append((admitted_s, wait_s))

    def record_output(self, num_output_tokens: int) -> None:
        self._outputs.append(num_output_tokens)

    def typical_output_tokens(self) -> float | None:
        """The p90 of recent finished requests' output tokens; None before the first. A high
        percentile: predicting a sequence ends sooner than it does admits requests that then
        wait past their SLO, predicting it later only refuses a little early."""
        outputs = list(self._outputs)
        return float(percentile(outputs, 90)) if outputs else None

    def _recent_waits(self, waits: deque[tuple[float, float]], now: float) -> list[float]:
        """The waits admitted in the last wait_window_s. list() copies in one C call under the
        GIL: safe while the engine thread appends."""
        return [w for t, w in list(waits) if t >= now - self.wait_window_s]

    def queue_wait_p50_by_tier(self, now: float) -> dict[str, float]:
        """Per tier, the p50 queue wait of the last wait_window_s (tiers seen in it only)."""
        recent = {t: self._recent_waits(w, now) for t, w in list(self._waits_by_tier.items())}
        return {tier: percentile(waits, 50) for tier, waits in recent.items() if waits}

    def tokens_per_s(self, now: float) -> float:
        # list() copies in one C call under the GIL: safe while the engine thread appends.
        recent = [(t, n) for t, n in list(self._tokens) if t >= now - self.window_s]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0][0], 1e-9)
        return sum(n for _, n in recent[1:]) / span

    def queue_wait_percentiles(self, now: float) -> tuple[float, float]:
        """p50 and p99 of the queue waits admitted in the last wait_window_s; 0 without any."""
        waits = self._recent_waits(self._waits, now)
        return percentile(waits, 50), percentile(waits, 99)


def engine_stats(engine, now: float) -> EngineStats:
    """The snapshot of one engine (LLMEngine.stats); safe while a step runs on another thread:
    every read of a queue is a copy."""
    from serving.engine.ledger import concurrency_limit  # stats stays importable without torch

    cfg, pool, ledger, tracker = engine.config, engine.pool, engine.ledger, engine.tracker
    running = {t.name.lower(): 0 for t in Tier}
    for seq in engine.running_requests():
        running[seq.tier.name.lower()] += 1
    p50, p99 = tracker.queue_wait_percentiles(now)
    return EngineStats(
        running_by_tier=running,
        waiting_by_tier=engine.waiting_by_tier(),
        num_kv_blocks_total=pool.num_blocks,
        num_kv_blocks_used=pool.num_used_blocks,
        num_kv_blocks_reserved=ledger.num_reserved_blocks,
        num_kv_blocks_cached=pool.num_cached_blocks,
        prefix_cache_query_tokens=ledger.num_query_tokens,
        prefix_cache_hit_tokens=ledger.num_hit_tokens,
        block_size_tokens=pool.block_size_tokens,
        concurrency_limit=concurrency_limit(
            ledger.use_fraction,
            cfg.min_num_seqs,
            cfg.max_num_seqs,
            cfg.kv_low_watermark,
            cfg.kv_high_watermark,
        ),
        tokens_per_s=tracker.tokens_per_s(now),
        queue_wait_p50_s=p50,
        queue_wait_p99_s=p99,
        num_preemptions=tracker.num_preemptions,
        num_finished=tracker.num_finished,
        num_timeouts=tracker.num_timeouts,
        queue_wait_p50_by_tier=tracker.queue_wait_p50_by_tier(now),
        **_lora_counts(getattr(engine, "adapters", None)),
    )


def _lora_counts(adapters) -> dict:
    """The slot pool's counters (engine.adapters is None without adapters: all zero)."""
    if adapters is None:
        return {}
    slots = adapters.pool
    return {
        "num_lora_hits": slots.num_hits,
        "num_lora_loads": slots.num_loads,
        "num_lora_evictions": slots.num_evictions,
        "lora_load_s": adapters.load_s_total,
        "lora_slots_total": slots.num_slots,
        "lora_in_slots": tuple(sorted(dict(slots.slot_of))),  # dict(): a copy in one C call
    }
