"""LoadSnapshot: the work an engine holds, in the units a TTFT prediction needs. No Ray.

What admission (serving/llm/admission.py) predicts a new request's time to first token from:

  step cost    step_s = step_fixed_s + step_per_token_s x tokens, least squares over the engine's
               last RECENT_STEPS steps (its own measurements, on the hardware it runs on now:
               contention from neighbours shows up as slower steps), plus the mean gap between
               two busy steps in the fixed part: the hand-offs between the stepping thread and
               the event loop, and whatever that loop serves meanwhile (refusals, streams),
               grow with load and are time no step measures (serving/engine/driver.py)
  slots        the concurrency limit after the KV watermark slide (R8)
  running      the tokens each running sequence is still expected to generate, the offline ones
               last: an interactive request counts their slots as free, since the scheduler
               preempts offline work for an interactive request waiting for a slot
  waiting      per tier: how many wait, their mean prompt and expected output tokens

Expected output of a request: its max_tokens, capped by the p90 output length of the engine's
recently finished requests once it has some (a chat request that names no max_tokens asks for
up to 256 tokens and usually stops far earlier); a running sequence past that length is expected
to need one more token.

The snapshot is plain data (frozen, picklable): the replica sends it with a refusal, and the
ingress applies the same prediction to it to skip that pool until capacity is predicted to free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from common.tiers import TIERS
from serving.engine.sequence import Tier
from serving.engine.window import fit_line

RECENT_STEPS = 128


@dataclass(frozen=True, slots=True)
class QueueSummary:
    num: int = 0
    prompt_tokens_mean: float = 0.0
    output_tokens_mean: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    taken_s: float  # the clock of whoever holds it (the ingress re-stamps it on receipt)
    step_fixed_s: float
    step_per_token_s: float
    max_batched_tokens: int  # a prompt longer than this prefills in several steps
    slots: int
    running_remaining_tokens: tuple[int, ...] = ()
    waiting: Mapping[str, QueueSummary] = field(default_factory=dict)
    # of the running sequences, the offline ones: each yields its slot to an interactive request
    # that waits for one (the scheduler preempts it), so interactive work counts them as free
    num_running_offline: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "running_remaining_tokens", tuple(self.running_remaining_tokens))
        object.__setattr__(self, "waiting", MappingProxyType(dict(self.waiting)))

    def __reduce__(self):  # MappingProxyType does not pickle; rebuild from a plain dict
        fields = (self.taken_s, self.step_fixed_s, self.step_per_token_s, self.max_batched_tokens)
        rest = (self.slots, self.running_remaining_tokens, dict(self.waiting))
        return (type(self), fields + rest + (self.num_running_offline,))


def expected_output_tokens(max_tokens: int, typical_tokens: float | None) -> float:
    """What a request will generate: max_tokens, capped by the recent p90 when one exists."""
    if typical_tokens is None or typical_tokens <= 0:
        return float(max_tokens)
    return float(min(max_tokens, max(1.0, typical_tokens)))


def _summary(seqs, typical: float | None) -> QueueSummary:
    if not seqs:
        return QueueSummary()
    prompt = sum(s.num_prompt_tokens for s in seqs) / len(seqs)
    out = sum(expected_output_tokens(_max_tokens(s), typical) for s in seqs) / len(seqs)
    return QueueSummary(len(seqs), prompt, out)


def _max_tokens(seq) -> int:
    return max(1, seq.max_len_tokens - seq.num_prompt_tokens)


def load_snapshot(engine, now: float, slots: int) -> LoadSnapshot:
    """The engine's load now; `slots` is its concurrency limit (EngineStats). Reads what the
    stepping thread mutates through list() copies (one C call each under the GIL), as
    engine.stats() does."""
    steps = list(engine.step_log)[-RECENT_STEPS:]
    fixed_s, per_token_s = fit_line([s.num_tokens for s in steps], [s.step_s for s in steps])
    gaps = list(engine.loop_gaps_s)
    fixed_s += sum(gaps) / len(gaps) if gaps else 0.0
    typical = engine.tracker.typical_output_tokens()
    remaining, offline = [], []  # offline last, so interactive can leave them out
    for seq in engine.running_requests():
        expected = expected_output_tokens(_max_tokens(seq), typical)
        left = max(1, round(expected) - seq.num_output_tokens)
        (offline if seq.tier is Tier.OFFLINE else remaining).append(left)
    queued: dict[str, list] = {t: [] for t in TIERS}
    for seq in engine.waiting_requests():
        queued[seq.tier.name.lower()].append(seq)
    for op, item in list(engine._inbox):  # submitted since the last step: ahead of the next one
        if op == "add":
            queued[item.tier.name.lower()].append(item)
    return LoadSnapshot(
        taken_s=now,
        step_fixed_s=fixed_s,
        step_per_token_s=per_token_s,
        max_batched_tokens=engine.config.max_num_batched_tokens,
        slots=slots,
        running_remaining_tokens=tuple(remaining + offline),
        waiting={t: _summary(seqs, typical) for t, seqs in queued.items()},
        num_running_offline=len(offline),
    )
