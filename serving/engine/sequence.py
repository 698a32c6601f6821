"""Request state: a small Enum, a slotted dataclass, terminal states listed explicitly."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NewType

import torch

from common.tiers import Tier
from serving.engine.outputs import TokenLogprob
from serving.engine.sampling_params import SamplingParams

RequestId = NewType("RequestId", str)


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_TIMEOUT = "timeout"


TERMINAL = frozenset(
    {
        SeqStatus.FINISHED_STOPPED,
        SeqStatus.FINISHED_LENGTH,
        SeqStatus.FINISHED_ABORTED,
        SeqStatus.FINISHED_TIMEOUT,
    }
)


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine.

    `token_ids` holds prompt then output; `num_computed_tokens` of them have KV in the cache. The
    tokens still to run are token_ids[num_computed_tokens:]: the prompt (or its rest, when prefill
    is chunked), the last sampled token when decoding, or everything again after a preemption.
    """

    request_id: RequestId
    token_ids: list[int]
    params: SamplingParams
    tier: Tier
    arrival_s: float
    deadline_s: float | None
    eos_token_ids: frozenset[int]
    max_total_tokens: int
    generator: torch.Generator | None = None
    matcher: Any = None  # llguidance matcher of a constrained request (serving/engine/grammar.py)
    adapter: str | None = None  # the LoRA adapter it runs with (serving/engine/lora/); None: base
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when asked
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_preemptions: int = 0
    error: str | None = None
    # Chained hashes of the full blocks of token_ids (serving/engine/prefix_cache.py), filled
    # lazily by the ledger; tokens only grow, so a hash once taken stays right.
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("prompt must hold at least one token")
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def max_len_tokens(self) -> int:
        """The longest this sequence can become: prompt + max_tokens, capped by the model."""
        if self.params.max_tokens is None:
            return self.max_total_tokens
        return min(self.num_prompt_tokens + self.params.max_tokens, self.max_total_tokens)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.finished else None

    def stop_reason_after(self, token_id: int) -> SeqStatus | None:
        """The terminal state reached by appending `token_id`, or None to go on."""
        p = self.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            return SeqStatus.FINISHED_STOPPED
        if token_id in p.stop_token_ids:
            return SeqStatus.FINISHED_STOPPED
        if self.matcher is not None and self.matcher.is_stopped():  # the grammar is complete
            return SeqStatus.FINISHED_STOPPED
        if self.num_tokens >= self.max_total_tokens:
            return SeqStatus.FINISHED_LENGTH
        if p.max_tokens is not None and self.num_output_tokens >= p.max_tokens:
            return SeqStatus.FINISHED_LENGTH
        return None
