"""Predicted time to first token of a new request on one engine. Pure: time is passed in.

From a LoadSnapshot (serving/engine/load.py), without new arrivals:

  1. every slot frees when its running sequence has generated its expected remaining tokens,
     one per full decode step (step_s = fixed + per_token x slots); an empty slot is free now;
  2. the requests waiting in this tier and the tiers served before it (the scheduler admits
     them first; lower tiers are not ahead) take the earliest free slot in turn, each holding
     it for its prefill and its expected output;
  3. the new request takes the next free slot, after the step in flight, and its first token
     comes one prefill later: ceil(prompt / max_batched_tokens) steps carrying its prompt
     tokens beside the running decodes.

The time elapsed since the snapshot was taken moves every slot's free time closer, so the same
snapshot answers later questions (the ingress keeps one per pool from its last refusal).

`free_in_s` is how long until a request like this one would fit a TTFT budget: the prediction
falls one second per second while the requests ahead drain, so it is ttft - budget (or, when
the request fits but the queue is full, the time until the next slot frees).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from common.tiers import tiers_up_to
from serving.engine.load import LoadSnapshot


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float  # predicted time to first token
    wait_s: float  # of it: the wait for a slot (0: a slot is free now)
    next_free_s: float  # until the next slot frees (0: one is free now)

    def free_in_s(self, budget_s: float) -> float:
        """Seconds until a request of this kind is predicted to fit `budget_s`."""
        return max(self.ttft_s - budget_s, 0.0)


def decode_step_s(load: LoadSnapshot) -> float:
    """One decode step with every slot busy: the pace at which running sequences advance."""
    return load.step_fixed_s + load.step_per_token_s * max(load.slots, 1)


def prefill_s(load: LoadSnapshot, prompt_tokens: float) -> float:
    """Steps that carry a prompt of `prompt_tokens` beside the other slots' decodes."""
    chunks = max(1, math.ceil(prompt_tokens / max(load.max_batched_tokens, 1)))
    decodes = max(load.slots - 1, 0)
    return chunks * load.step_fixed_s + load.step_per_token_s * (prompt_tokens + chunks * decodes)


def predict_ttft(load: LoadSnapshot, tier: str, prompt_tokens: int, now: float) -> Prediction:
    """The TTFT a request of `tier` with `prompt_tokens` would see, arriving at `now`."""
    step_s = decode_step_s(load)
    running = load.running_remaining_tokens
    if tier == "interactive" and load.num_running_offline:  # offline yields its slots to it
        running = running[: len(running) - load.num_running_offline]
    running = running[: max(load.slots, 1)]
    free_at = [r * step_s for r in running] + [0.0] * max(load.slots - len(running), 0)
    if not free_at:  # a limit of 0 slots: nothing frees until a sequence is admitted
        free_at = [0.0]
    heapq.heapify(free_at)
    first_free_s = free_at[0]
    for ahead in tiers_up_to(tier):
        queue = load.waiting.get(ahead)
        if queue is None or queue.num == 0:
            continue
        hold_s = prefill_s(load, queue.prompt_tokens_mean) + queue.output_tokens_mean * step_s
        for _ in range(queue.num):
            heapq.heappush(free_at, heapq.heappop(free_at) + hold_s)
    elapsed_s = max(now - load.taken_s, 0.0)
    wait_s = max(free_at[0] - elapsed_s, 0.0)
    in_flight_s = step_s if load.step_fixed_s > 0 or load.step_per_token_s > 0 else 0.0
    ttft_s = wait_s + in_flight_s + prefill_s(load, prompt_tokens)
    return Prediction(ttft_s, wait_s, max(first_free_s - elapsed_s, 0.0))
