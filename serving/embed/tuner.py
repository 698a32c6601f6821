"""The R7 online batch tuner: a pure decision from one interval's measurements and `now`.

    start at size 8, window 50 ms
    p99 rose markedly (over target, or rise_factor x the p99 before the last doubling and
        above rise_floor x target: a jump from 1 ms to 2 ms is noise, not a marked rise)
        -> step back one size (halve) and cut the window by 10 ms; that size becomes a ceiling
    p99 within target and busy time (GPU utilisation, or CPU busy time) in 50-70%
        -> hold: the healthy band
    p99 within target otherwise -> double the size (8, 16, 32, 64), never into the ceiling

The knobs are generic: `size` is a batch target here, and can equally be the LLM engine's
concurrency ceiling (max_num_seqs) with the window switched off (start_window_s=0,
window_step_s=0): the same rule then doubles concurrency while p99 holds and backs off when
it does not. The caller (serving/embed/batch_loop.py) measures, calls `decide` once per interval,
applies the knobs, logs the reason and sets the metrics; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from common.validate import check_order, check_range

DOUBLE, STEP_BACK, HOLD = "double", "step_back", "hold"


@dataclass(frozen=True, slots=True)
class TunerConfig:
    _owner: ClassVar[str] = "tuner"

    p99_target_s: float
    start_size: int = 8
    start_window_s: float = 0.05
    min_size: int = 1
    max_size: int = 64
    window_step_s: float = 0.01
    min_window_s: float = 0.0
    rise_factor: float = 1.5  # p99 this many times the pre-doubling p99 is a "marked" rise...
    rise_floor: float = 0.5  # ...once it is also above this share of the target (noise below)
    busy_low: float = 0.5  # the healthy band of busy time (R7: utilisation 50-70%)
    busy_high: float = 0.7
    min_samples: int = 20  # fewer finished requests in an interval: no decision
    ceiling_ttl_s: float = 300.0  # a failed size may be tried again after this long

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "p99_target_s", self.p99_target_s, 0.0, None, lo_open=True)
        for name in ("start_size", "min_size", "max_size", "min_samples"):
            check_range(o, name, getattr(self, name), 1, None, integer=True)
        check_order(
            o,
            ("min_size", self.min_size),
            ("start_size", self.start_size),
            ("max_size", self.max_size),
        )
        for name in ("start_window_s", "window_step_s", "min_window_s", "ceiling_ttl_s"):
            check_range(o, name, getattr(self, name), 0.0, None)
        check_order(o, ("min_window_s", self.min_window_s), ("start_window_s", self.start_window_s))
        check_range(o, "rise_factor", self.rise_factor, 1.0, None, lo_open=True)
        check_range(o, "rise_floor", self.rise_floor, 0.0, 1.0)
        check_range(o, "busy_low", self.busy_low, 0.0, 1.0)
        check_range(o, "busy_high", self.busy_high, 0.0, 1.0)
        check_order(o, ("busy_low", self.busy_low), ("busy_high", self.busy_high))


@dataclass(frozen=True, slots=True)
class Observation:
    """One interval of traffic: p99 latency of finished requests, share of time busy computing."""

    p99_s: float
    busy_fraction: float
    num_samples: int


@dataclass(frozen=True, slots=True)
class TunerState:
    size: int
    window_s: float
    baseline_p99_s: float | None = None  # p99 measured just before the last doubling
    ceiling_size: int | None = None  # the size whose p99 failed; not doubled into again
    ceiling_since_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TunerDecision:
    action: str  # DOUBLE | STEP_BACK | HOLD
    size: int
    window_s: float
    reason: str

    @property
    def changed(self) -> bool:
        return self.action != HOLD


def initial_state(cfg: TunerConfig) -> TunerState:
    return TunerState(size=cfg.start_size, window_s=cfg.start_window_s)


def decide(
    obs: Observation, state: TunerState, cfg: TunerConfig, now: float
) -> tuple[TunerDecision, TunerState]:
    """The next knobs and why (see the module table)."""
    if state.ceiling_size is not None and now - state.ceiling_since_s >= cfg.ceiling_ttl_s:
        state = replace(state, ceiling_size=None)  # traffic changes over the day: retry
    if obs.num_samples < cfg.min_samples:
        why = f"{obs.num_samples} samples < min_samples={cfg.min_samples}"
        return _hold(state, why), state
    p99 = f"p99 {obs.p99_s * 1e3:.1f} ms"
    target = f"target {cfg.p99_target_s * 1e3:.1f} ms"
    over = obs.p99_s > cfg.p99_target_s
    base = state.baseline_p99_s
    jumped = (
        base is not None
        and obs.p99_s > cfg.rise_factor * base
        and obs.p99_s > cfg.rise_floor * cfg.p99_target_s
    )
    if over or jumped:
        cause = f"{p99} > {target}" if over else f"{p99} > {cfg.rise_factor} x {base * 1e3:.1f} ms"
        return _step_back(state, cfg, now, cause)
    busy = f"busy {obs.busy_fraction:.0%}"
    if cfg.busy_low <= obs.busy_fraction <= cfg.busy_high:
        return _hold(state, f"healthy: {p99} within {target}, {busy} in band"), state
    bigger = state.size * 2
    if bigger > cfg.max_size or (state.ceiling_size is not None and bigger >= state.ceiling_size):
        limit = cfg.max_size if bigger > cfg.max_size else state.ceiling_size
        return _hold(state, f"{p99} within {target}; size {bigger} would pass {limit}"), state
    new = replace(state, size=bigger, baseline_p99_s=obs.p99_s)
    why = f"{p99} within {target}, {busy}: double {state.size} -> {bigger}"
    return TunerDecision(DOUBLE, new.size, new.window_s, why), new


def _hold(state: TunerState, reason: str) -> TunerDecision:
    return TunerDecision(HOLD, state.size, state.window_s, reason)


def _step_back(
    state: TunerState, cfg: TunerConfig, now: float, cause: str
) -> tuple[TunerDecision, TunerState]:
    size = max(cfg.min_size, state.size // 2)
    window_s = max(cfg.min_window_s, round(state.window_s - cfg.window_step_s, 9))
    if size == state.size and window_s == state.window_s:
        return _hold(state, f"{cause}, already at min size and window"), state
    new = TunerState(size, window_s, None, state.size, now)
    why = (
        f"{cause}: size {state.size} -> {size}, "
        f"window {state.window_s * 1e3:.0f} -> {window_s * 1e3:.0f} ms"
    )
    return TunerDecision(STEP_BACK, size, window_s, why), new
