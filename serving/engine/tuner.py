"""The concurrency tuner (R7 for continuous batching): a pure decision from one interval and `now`.

Two knobs: the concurrency ceiling (max_num_seqs) and the per-step token budget
(max_num_batched_tokens). Latencies arrive as ratios to the tier's SLO (p99 / SLO, the worst tier),
so 1.0 is the line. In order:

    inter-token p99 over its SLO        a step takes too long: the batch is too big.
                                        Shrink the budget when prefill fills the steps,
                                        else the ceiling; the failed size becomes a ceiling.
    TTFT p99 over its SLO, queue wait   requests wait for admission. If a knob binds and the steps
      past half the SLO (R10)           have room, raise it; otherwise arrivals exceed what the
                                        replica serves: hold and signal "scale out" (more
                                        replicas, not a smaller batch).
    TTFT p99 over, queue wait low       prefill of long prompts takes many chunks: raise the budget
                                        while the steps have room.
    a raise cost throughput             scheduled tokens per busy second fell by a quarter: step
                                        back.
    within SLO with headroom            raise the knob that binds (x2), never above what the KV
                                        budget admits, never into a failed size.

A raise must also pass the step-cost line measured over the interval (step_s = fixed +
per_token x tokens): the predicted step at the bigger size stays under raise_below x the
inter-token SLO, so the tuner does not probe into a breach it can already see; when no knob may
grow, a queue is arrivals, not batch size. A budget step-back cuts to what the line says fits.

"Binds" is measured, not guessed: the share of steps in which admission stopped at the ceiling
(or used up the token budget) while requests waited. Nothing here reads a clock or touches the
engine; serving/engine/tuning.py measures, calls `decide` and applies the knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from common.validate import check_order, check_range

RAISE, SHRINK, HOLD, SCALE_OUT = "raise", "shrink", "hold", "scale_out"


@dataclass(frozen=True, slots=True)
class TunerConfig:
    _owner: ClassVar[str] = "TunerConfig"

    min_num_seqs: int = 1
    max_num_seqs: int = 1024
    min_batched_tokens: int = 32
    max_batched_tokens: int = 8192
    raise_below: float = 0.8  # raise a knob only while every p99 is below this share of its SLO
    queue_share: float = 0.5  # R10: queue wait past half the TTFT SLO is a queueing problem
    bound_share: float = 0.25  # a knob binds when admission stopped on it in this share of steps
    prefill_share: float = 0.5  # steps mostly prefill: the budget, not the ceiling, makes them long
    efficiency_drop: float = 0.25  # tokens per busy second this much below the pre-raise level
    min_samples: int = 4  # first tokens in an interval below this: no TTFT decision
    min_gaps: int = 20  # inter-token gaps in an interval below this: no inter-token decision
    ceiling_ttl_s: float = 120.0  # a failed size may be tried again after this long

    def __post_init__(self) -> None:
        o = self._owner
        for name in ("min_num_seqs", "max_num_seqs", "min_batched_tokens", "max_batched_tokens"):
            check_range(o, name, getattr(self, name), 1, None, integer=True)
        check_order(o, ("min_num_seqs", self.min_num_seqs), ("max_num_seqs", self.max_num_seqs))
        check_order(
            o,
            ("min_batched_tokens", self.min_batched_tokens),
            ("max_batched_tokens", self.max_batched_tokens),
        )
        for name in ("raise_below", "queue_share", "bound_share", "prefill_share"):
            check_range(o, name, getattr(self, name), 0.0, 1.0, lo_open=True)
        check_range(o, "efficiency_drop", self.efficiency_drop, 0.0, 1.0)
        check_range(o, "min_samples", self.min_samples, 1, None, integer=True)
        check_range(o, "min_gaps", self.min_gaps, 1, None, integer=True)
        check_range(o, "ceiling_ttl_s", self.ceiling_ttl_s, 0.0, None)


@dataclass(frozen=True, slots=True)
class Observation:
    """One interval. Ratios are p99 / SLO of the worst tier (1.0 = at the SLO)."""

    num_samples: int  # requests that got their first token
    num_gaps: int  # inter-token gaps measured
    ttft_ratio: float
    itl_ratio: float
    queue_ratio: float  # admission wait p99 / TTFT SLO
    tokens_per_busy_s: float  # scheduled tokens per second spent in steps
    arrivals_per_s: float
    busy_fraction: float  # share of the interval spent in steps
    ceiling_bound: float  # share of steps: admission stopped at the ceiling with requests waiting
    budget_bound: float  # share of steps: the token budget ran out with work left
    prefill_fraction: float  # prefill tokens / all tokens scheduled
    kv_admissible_seqs: int  # sequences of the recent average size the KV budget holds
    # The step-cost line step_s = fixed + per_token x tokens (0, 0: unknown), the interval's mean
    # step size, and the tightest inter-token SLO (None: none), to predict a raise's step time.
    step_fixed_s: float = 0.0
    step_per_token_s: float = 0.0
    mean_tokens_per_step: float = 0.0
    itl_slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class TunerState:
    max_num_seqs: int
    max_batched_tokens: int
    seqs_ceiling: int | None = None  # a ceiling that failed; not raised into again
    tokens_ceiling: int | None = None
    ceiling_since_s: float = 0.0
    raised: str | None = None  # the knob raised by the last move, judged by the next interval
    efficiency_before_raise: float = 0.0


@dataclass(frozen=True, slots=True)
class Move:
    action: str  # RAISE | SHRINK | HOLD | SCALE_OUT
    knob: str | None  # "max_num_seqs" | "max_num_batched_tokens" | None
    max_num_seqs: int
    max_batched_tokens: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.action in (RAISE, SHRINK)


def initial_state(cfg: TunerConfig, max_num_seqs: int, max_batched_tokens: int) -> TunerState:
    seqs = min(max(max_num_seqs, cfg.min_num_seqs), cfg.max_num_seqs)
    tokens = min(max(max_batched_tokens, cfg.min_batched_tokens), cfg.max_batched_tokens)
    return TunerState(seqs, max(tokens, seqs))


def decide(
    obs: Observation, state: TunerState, cfg: TunerConfig, now: float
) -> tuple[Move, TunerState]:
    """The next knobs and why (see the module table)."""
    if now - state.ceiling_since_s >= cfg.ceiling_ttl_s:  # traffic changes: retry failed sizes
        state = replace(state, seqs_ceiling=None, tokens_ceiling=None)
    kv_cap = max(cfg.min_num_seqs, obs.kv_admissible_seqs)
    if state.max_num_seqs > kv_cap:
        why = f"KV budget admits {kv_cap} sequences of the recent size"
        return _set(state, "max_num_seqs", kv_cap, SHRINK, why)
    lat = (
        f"TTFT p99 {obs.ttft_ratio:.2f}x SLO, inter-token p99 {obs.itl_ratio:.2f}x, "
        f"queue p99 {obs.queue_ratio:.2f}x"
    )
    if obs.itl_ratio > 1.0 and obs.num_gaps >= cfg.min_gaps:
        return _batch_too_big(obs, state, cfg, now, lat)
    if obs.num_samples < cfg.min_samples:
        return _hold(state, f"{obs.num_samples} first tokens < min_samples={cfg.min_samples}")
    if state.raised is not None and obs.tokens_per_busy_s < (1 - cfg.efficiency_drop) * (
        state.efficiency_before_raise
    ):
        why = (
            f"raising {state.raised} cut tokens per busy second "
            f"{state.efficiency_before_raise:.0f} -> {obs.tokens_per_busy_s:.0f}"
        )
        return _step_back(obs, state, cfg, state.raised, now, why)
    state = replace(state, raised=None)
    if obs.ttft_ratio > 1.0:
        return _slow_first_token(obs, state, cfg, kv_cap, lat)
    if max(obs.ttft_ratio, obs.itl_ratio) > cfg.raise_below:
        return _hold(state, f"{lat}: within SLO, near the line")
    return _grow(obs, state, cfg, kv_cap, f"{lat}: headroom")


def predicted_step_s(obs: Observation, num_tokens: float) -> float | None:
    """Step time at `num_tokens` scheduled tokens from the interval's step-cost line."""
    if obs.step_per_token_s <= 0 and obs.step_fixed_s <= 0:
        return None
    return obs.step_fixed_s + obs.step_per_token_s * num_tokens


def _batch_too_big(obs, state, cfg, now, lat) -> tuple[Move, TunerState]:
    """Step time, not arrivals: the steps themselves are too long for the inter-token SLO."""
    prefill_heavy = obs.prefill_fraction >= cfg.prefill_share
    knob = "max_num_batched_tokens" if prefill_heavy else "max_num_seqs"
    if knob == "max_num_batched_tokens" and state.max_batched_tokens <= cfg.min_batched_tokens:
        knob = "max_num_seqs"
    why = f"{lat}: steps too long (batch too big; prefill {obs.prefill_fraction:.0%} of tokens)"
    return _step_back(obs, state, cfg, knob, now, why)


def _slow_first_token(obs, state, cfg, kv_cap, lat) -> tuple[Move, TunerState]:
    if obs.queue_ratio > cfg.queue_share:  # R10: waiting for admission, not for compute
        if obs.ceiling_bound >= cfg.bound_share:
            move = _raise(obs, state, cfg, "max_num_seqs", kv_cap, f"{lat}: queueing at the cap")
            if move is not None:
                return move
        if obs.budget_bound >= cfg.bound_share:
            why = f"{lat}: queueing on the budget"
            move = _raise(obs, state, cfg, "max_num_batched_tokens", kv_cap, why)
            if move is not None:
                return move
        why = (
            f"{lat}: arrivals {obs.arrivals_per_s:.2f}/s exceed what this replica serves "
            f"(busy {obs.busy_fraction:.0%}, no knob can grow within the inter-token SLO); "
            "queueing needs more replicas, not a smaller batch"
        )
        return Move(SCALE_OUT, None, state.max_num_seqs, state.max_batched_tokens, why), state
    move = _raise(obs, state, cfg, "max_num_batched_tokens", kv_cap, f"{lat}: prefill-bound")
    if move is not None:
        return move
    return _hold(state, f"{lat}: first token late from prefill, no knob has room")


def _grow(obs, state, cfg, kv_cap, why) -> tuple[Move, TunerState]:
    if obs.ceiling_bound >= cfg.bound_share:
        move = _raise(obs, state, cfg, "max_num_seqs", kv_cap, f"{why}, the cap binds")
        if move is not None:
            return move
    if obs.budget_bound >= cfg.bound_share:
        move = _raise(obs, state, cfg, "max_num_batched_tokens", kv_cap, f"{why}, budget binds")
        if move is not None:
            return move
    return _hold(state, f"{why}; no knob binds or can grow")


def _raise(obs, state, cfg, knob, kv_cap, why) -> tuple[Move, TunerState] | None:
    """Double `knob` (up to its limit, never into a failed size, never past what the step-cost
    line says the inter-token SLO allows); None when it cannot move."""
    seqs = knob == "max_num_seqs"
    old = state.max_num_seqs if seqs else state.max_batched_tokens
    failed = state.seqs_ceiling if seqs else state.tokens_ceiling
    if failed is not None and 2 * old >= failed:
        return None  # R7: the size above failed; stay one step below it
    new = min(2 * old, *((cfg.max_num_seqs, kv_cap) if seqs else (cfg.max_batched_tokens,)))
    if new <= old:
        return None
    # a bigger cap adds decode rows to every step; a bigger budget allows a fuller step
    tokens = obs.mean_tokens_per_step + (new - old) if seqs else new
    step = predicted_step_s(obs, tokens)
    if step is not None and obs.itl_slo_s and step > cfg.raise_below * obs.itl_slo_s:
        return None
    move, new_state = _set(state, knob, new, RAISE, why)
    return move, replace(new_state, raised=knob, efficiency_before_raise=obs.tokens_per_busy_s)


def _step_back(obs, state, cfg, knob, now, why) -> tuple[Move, TunerState]:
    """Halve `knob`, or cut the budget to what the step-cost line says fits the SLO, if less."""
    seqs = knob == "max_num_seqs"
    old = state.max_num_seqs if seqs else state.max_batched_tokens
    floor = cfg.min_num_seqs if seqs else cfg.min_batched_tokens
    new = old // 2
    if not seqs and obs.itl_slo_s and obs.step_per_token_s > 0:
        fits = (cfg.raise_below * obs.itl_slo_s - obs.step_fixed_s) / obs.step_per_token_s
        new = min(new, int(fits))
    new = max(floor, new)
    if new >= old:
        return _hold(state, f"{why}; {knob} already at its minimum {floor}")
    ceiling = {"seqs_ceiling" if seqs else "tokens_ceiling": old}
    move, new_state = _set(replace(state, **ceiling), knob, new, SHRINK, why)
    return move, replace(new_state, ceiling_since_s=now)


def _set(state, knob, value, action, why) -> tuple[Move, TunerState]:
    if knob == "max_num_seqs":
        # The budget always holds one decode token per running sequence.
        new = replace(state, max_num_seqs=value, raised=None)
        if new.max_batched_tokens < value:
            new = replace(new, max_batched_tokens=value)
    else:
        new = replace(state, max_batched_tokens=value, raised=None)
        if new.max_num_seqs > value:
            new = replace(new, max_num_seqs=value)
    old = state.max_num_seqs if knob == "max_num_seqs" else state.max_batched_tokens
    reason = f"{why}: {knob} {old} -> {value}"
    return Move(action, knob, new.max_num_seqs, new.max_batched_tokens, reason), new


def _hold(state: TunerState, why: str) -> tuple[Move, TunerState]:
    return Move(HOLD, None, state.max_num_seqs, state.max_batched_tokens, why), state
