"""The concurrency tuner in the loop: measure an interval, `decide` (tuner.py), move the knobs.

    engine.step() ──on_step──▶ StepWindow (window.py)
    EngineTuner.maybe_tune(now) ── every interval_s: window.take() -> observation() -> decide()
                               -> engine.set_limits(...); the move is logged with its reason and
                               handed to `on_move` (the replica's metrics)

`maybe_tune` runs on the caller's thread (a replica's event loop, a benchmark's loop); the window
locks against the stepping thread. Time is always passed in.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from serving.engine.tuner import Move, Observation, TunerConfig, decide, initial_state
from serving.engine.window import StepWindow, WindowSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TierSlo:
    ttft_p99_s: float
    itl_p99_s: float | None = None


def _worst(p99_by_tier: Mapping[str, float], slos: Mapping[str, TierSlo], field: str) -> float:
    worst = 0.0
    for tier, p99 in p99_by_tier.items():
        slo = getattr(slos[tier], field) if tier in slos else None
        if slo:
            worst = max(worst, p99 / slo)
    return worst


def observation(s: WindowSummary, slos: Mapping[str, TierSlo], min_samples: int = 1) -> Observation:
    """The tuner's view of an interval: latencies as p99 / SLO of the worst tier. With fewer
    than `min_samples` first tokens in the interval, TTFT and admission wait come from the last
    RECENT_S seconds instead (few, long requests)."""
    recent = s.num_first_tokens < min_samples
    ttft = s.recent_ttft_p99_s if recent else s.ttft_p99_s
    wait = s.recent_queue_wait_p99_s if recent else s.queue_wait_p99_s
    return Observation(
        num_samples=s.num_recent_first_tokens if recent else s.num_first_tokens,
        num_gaps=s.num_gaps,
        ttft_ratio=_worst(ttft, slos, "ttft_p99_s"),
        itl_ratio=_worst(s.itl_p99_s, slos, "itl_p99_s"),
        queue_ratio=_worst(wait, slos, "ttft_p99_s"),
        tokens_per_busy_s=s.tokens_per_busy_s,
        arrivals_per_s=s.arrivals_per_s,
        busy_fraction=s.busy_fraction,
        ceiling_bound=s.ceiling_bound,
        budget_bound=s.budget_bound,
        prefill_fraction=s.prefill_fraction,
        kv_admissible_seqs=s.kv_admissible_seqs,
        step_fixed_s=s.step_fixed_s,
        step_per_token_s=s.step_per_token_s,
        mean_tokens_per_step=s.mean_tokens_per_step,
        itl_slo_s=_tightest_itl(s, slos),
    )


def _tightest_itl(s: WindowSummary, slos: Mapping[str, TierSlo]) -> float | None:
    """The smallest inter-token SLO among the tiers that produced tokens in the interval."""
    found = [slos[t].itl_p99_s for t in s.itl_p99_s if t in slos and slos[t].itl_p99_s]
    return min(found, default=None)


class EngineTuner:
    """Runs the tuner against one engine; `on_move` sees every decision (metrics, logs)."""

    def __init__(
        self,
        engine,
        slos: Mapping[str, TierSlo],
        now: float,
        interval_s: float = 5.0,
        config: TunerConfig | None = None,
        on_move: Callable[[Move], None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r} must be > 0")
        self.engine = engine
        self.slos = dict(slos)
        self.interval_s = interval_s
        cfg = engine.config
        # The configured budget is what the KV reservations and a GPU's warm-up pass were sized
        # for: the tuner moves the budget below it, never above.
        budget = cfg.max_num_batched_tokens
        self.config = config or TunerConfig(
            min_batched_tokens=min(32, budget), max_batched_tokens=budget
        )
        self.state = initial_state(self.config, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        self.window = StepWindow(now)
        self.on_move = on_move
        self.moves: deque[tuple[float, Move]] = deque(maxlen=256)
        self.last_summary: WindowSummary | None = None
        self._next_s = now + interval_s
        engine.set_limits(self.state.max_num_seqs, self.state.max_batched_tokens)
        engine.observers.append(self.window)

    def maybe_tune(self, now: float) -> Move | None:
        """Decide once per interval; returns the move made (None between intervals)."""
        if now < self._next_s:
            return None
        self._next_s = now + self.interval_s
        self.last_summary = self.window.take(now, self.engine)
        obs = observation(self.last_summary, self.slos, self.config.min_samples)
        move, self.state = decide(obs, self.state, self.config, now)
        if move.changed:
            self.engine.set_limits(move.max_num_seqs, move.max_batched_tokens)
            log.info("tuner %s: %s", move.action, move.reason)
        else:
            log.debug("tuner %s: %s", move.action, move.reason)
        self.moves.append((now, move))
        if self.on_move is not None:
            self.on_move(move)
        return move
