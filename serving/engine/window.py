"""StepWindow: what an interval of engine steps looked like, for the tuner and for `doctor`.

An engine observer (`engine.observers`): `on_step` runs after every step on the stepping thread,
`take(now, ...)` closes the interval from another thread and returns a frozen `WindowSummary`:
per-tier p99 of TTFT, inter-token gap and admission wait; busy time; which admission limit stopped
the steps while requests waited; the step-cost line step_s = fixed + per_token x tokens (least
squares over the interval's steps, the "compute efficiency" of R10's triage). Time is passed in.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from capacity.memory import blocks_for_tokens
from common.stats import percentile
from serving.engine.sequence import SeqStatus

_NO_TOKEN = frozenset({SeqStatus.FINISHED_ABORTED, SeqStatus.FINISHED_TIMEOUT})
RECENT_S = 30.0


@dataclass(frozen=True, slots=True)
class WindowSummary:
    span_s: float
    num_steps: int
    busy_s: float
    num_first_tokens: int
    num_gaps: int  # inter-token gaps measured
    output_tokens: int
    num_arrivals: int
    num_completions: int
    waiting_start: int
    waiting_end: int
    ceiling_bound: float  # share of steps: admission stopped at max_num_seqs, requests waiting
    budget_bound: float  # share of steps: the token budget ran out, requests waiting
    kv_bound: float  # share of steps: admission stopped on the KV budget, requests waiting
    prefill_fraction: float  # prefill tokens / all scheduled tokens
    mean_tokens_per_step: float
    step_fixed_s: float  # fitted: a step of 0 tokens
    step_per_token_s: float  # fitted: each scheduled token adds this
    avg_request_tokens: float  # recent admitted prompt + max_tokens (0: none seen)
    kv_admissible_seqs: int  # such requests the whole KV budget holds
    ttft_p99_s: Mapping[str, float] = field(default_factory=dict)
    itl_p99_s: Mapping[str, float] = field(default_factory=dict)
    queue_wait_p99_s: Mapping[str, float] = field(default_factory=dict)
    # The same over the last RECENT_S seconds, across intervals: at a few long requests per
    # interval one interval holds too few first tokens to judge TTFT by.
    num_recent_first_tokens: int = 0
    recent_ttft_p99_s: Mapping[str, float] = field(default_factory=dict)
    recent_queue_wait_p99_s: Mapping[str, float] = field(default_factory=dict)
    # share of steps: every LoRA slot was pinned by other adapters' requests, requests waiting
    adapter_bound: float = 0.0

    @property
    def busy_fraction(self) -> float:
        return min(1.0, self.busy_s / max(self.span_s, 1e-9))

    @property
    def arrivals_per_s(self) -> float:
        return self.num_arrivals / max(self.span_s, 1e-9)

    @property
    def completions_per_s(self) -> float:
        return self.num_completions / max(self.span_s, 1e-9)

    @property
    def tokens_per_busy_s(self) -> float:
        """Scheduled tokens (prefill and decode) per second spent in steps: the engine's work
        rate, which a bigger batch raises while the fixed cost of a step dominates."""
        return self.mean_tokens_per_step * self.num_steps / max(self.busy_s, 1e-9)

    def throughput_gain(self, factor: float) -> float | None:
        """Predicted tokens/s at `factor` x the current step size over the current one: > 1 while
        the fixed cost dominates (bigger batches are nearly free), ~1 once compute-bound."""
        t = self.mean_tokens_per_step
        if self.num_steps < 4 or t <= 0:
            return None
        a, b = self.step_fixed_s, self.step_per_token_s
        return factor * (a + b * t) / (a + b * factor * t)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope), both >= 0; too little spread in x: all intercept."""
    n = len(xs)
    if n == 0:
        return 0.0, 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 3 or sxx <= (0.05 * mx) ** 2 * n:
        return my, 0.0
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
    return max(0.0, my - slope * mx), slope


class StepWindow:
    def __init__(self, now: float, recent_sizes: int = 64) -> None:
        self._lock = threading.Lock()
        self._last_token_s: dict[str, float] = {}
        self._sizes: deque[int] = deque(maxlen=recent_sizes)
        # (time, tier, ttft_s, queue_wait_s) of recent first tokens, kept across intervals
        self._firsts: deque[tuple[float, str, float, float]] = deque(maxlen=512)
        self._arrivals_at_start = 0
        self._waiting_at_start = 0
        self._reset(now)

    def _reset(self, now: float) -> None:
        self.start_s = now
        self.ttft: dict[str, list[float]] = defaultdict(list)
        self.itl: dict[str, list[float]] = defaultdict(list)
        self.queue: dict[str, list[float]] = defaultdict(list)
        self.steps: list[tuple[int, float]] = []  # (tokens, seconds)
        self.bound = {"ceiling": 0, "budget": 0, "kv": 0, "adapter": 0}
        self.prefill_tokens = self.output_tokens = self.completions = 0

    def on_step(self, engine, now: float, step_s: float, batch, touched) -> None:
        with self._lock:
            self.steps.append((batch.num_tokens, step_s))
            self.prefill_tokens += batch.num_tokens - batch.num_decodes
            if engine.num_waiting():
                reason = batch.admission_stop.reason
                if reason in ("ceiling", "kv", "adapter"):
                    self.bound[reason] += 1
                if batch.num_tokens >= engine.config.max_num_batched_tokens:
                    self.bound["budget"] += 1
            for seq in batch.admitted:
                self.queue[seq.tier.name.lower()].append(seq.admitted_s - seq.arrival_s)
                self._sizes.append(seq.max_len_tokens)
            for seq in touched:
                self._count_token(seq, now)

    def _count_token(self, seq, now: float) -> None:
        rid = seq.request_id
        if seq.finished:
            self.completions += 1
        if seq.status in _NO_TOKEN or seq.first_token_s is None:
            self._last_token_s.pop(rid, None)
            return
        tier = seq.tier.name.lower()
        last = self._last_token_s.get(rid)
        if last is None:
            ttft = seq.first_token_s - seq.arrival_s
            self.ttft[tier].append(ttft)
            wait = (seq.admitted_s or seq.first_token_s) - seq.arrival_s
            self._firsts.append((now, tier, ttft, wait))
        else:
            self.itl[tier].append(now - last)
        self.output_tokens += 1
        if seq.finished:
            self._last_token_s.pop(rid, None)
        else:
            self._last_token_s[rid] = now

    def take(self, now: float, engine) -> WindowSummary:
        """Close the interval (arrivals, waiting and KV size read from `engine`)."""
        arrivals, waiting = engine.num_arrivals, engine.num_waiting()
        pool = engine.pool
        with self._lock:
            summary = self._summary(now, arrivals, waiting, pool.num_blocks, pool.block_size_tokens)
            self._arrivals_at_start, self._waiting_at_start = arrivals, waiting
            self._reset(now)
            return summary

    def _summary(self, now, arrivals, waiting, num_blocks, block_size) -> WindowSummary:
        steps = max(len(self.steps), 1)
        tokens = sum(n for n, _ in self.steps)
        fixed, per_token = fit_line([n for n, _ in self.steps], [s for _, s in self.steps])
        avg_req = sum(self._sizes) / len(self._sizes) if self._sizes else 0.0
        return WindowSummary(
            span_s=max(now - self.start_s, 0.0),
            num_steps=len(self.steps),
            busy_s=sum(s for _, s in self.steps),
            num_first_tokens=sum(len(v) for v in self.ttft.values()),
            num_gaps=sum(len(v) for v in self.itl.values()),
            output_tokens=self.output_tokens,
            num_arrivals=arrivals - self._arrivals_at_start,
            num_completions=self.completions,
            waiting_start=self._waiting_at_start,
            waiting_end=waiting,
            ceiling_bound=self.bound["ceiling"] / steps,
            budget_bound=self.bound["budget"] / steps,
            kv_bound=self.bound["kv"] / steps,
            adapter_bound=self.bound["adapter"] / steps,
            prefill_fraction=self.prefill_tokens / max(tokens, 1),
            mean_tokens_per_step=tokens / steps,
            step_fixed_s=fixed,
            step_per_token_s=per_token,
            avg_request_tokens=avg_req,
            kv_admissible_seqs=self._kv_admissible(num_blocks, block_size),
            ttft_p99_s=_p99(self.ttft),
            itl_p99_s=_p99(self.itl),
            queue_wait_p99_s=_p99(self.queue),
            **self._recent(now),
        )

    def _recent(self, now: float) -> dict:
        ttft: dict[str, list[float]] = defaultdict(list)
        wait: dict[str, list[float]] = defaultdict(list)
        for t, tier, first_s, wait_s in self._firsts:
            if t >= now - RECENT_S:
                ttft[tier].append(first_s)
                wait[tier].append(wait_s)
        return {
            "num_recent_first_tokens": sum(len(v) for v in ttft.values()),
            "recent_ttft_p99_s": _p99(ttft),
            "recent_queue_wait_p99_s": _p99(wait),
        }

    def _kv_admissible(self, num_kv_blocks: int, block_size: int) -> int:
        if not self._sizes:
            return num_kv_blocks  # nothing seen yet: no KV bound known
        mean_blocks = sum(blocks_for_tokens(n, block_size) for n in self._sizes) / len(self._sizes)
        return max(1, int(num_kv_blocks / mean_blocks))


def _p99(samples: Mapping[str, list[float]]) -> dict[str, float]:
    return {tier: percentile(v, 99) for tier, v in samples.items() if v}
