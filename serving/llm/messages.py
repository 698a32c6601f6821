"""What crosses between the LLM deployments: frozen dataclasses, never string-keyed dicts.

    ingress ──GenerateRequest──▶ replica.generate_stream ──▶ Refusal | Failure | Delta, Delta...
    ingress ◀── ReplicaInfo ──── replica.info()
    replica ──ReplicaReport────▶ forecast controller (queue signals for the emergency path)
    ingress ──Completion / Delta──▶ handle callers in other Ray apps

A replica's stream opens with exactly one item that decides the outcome: a `Refusal` (the
ingress tries the next pool, or answers 429), a `Failure` (the request itself is bad: a 4xx), or
the first `Delta` (admitted; more deltas follow until one has `finished`).
"""

from __future__ import annotations

from dataclasses import dataclass

from common.tiers import check_tier
from serving.engine.outputs import TokenLogprob
from serving.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    tier: str = "interactive"
    timeout_s: float | None = None  # queue deadline; None: the tier's max_queue_wait_s

    def __post_init__(self) -> None:
        check_tier(self.tier, "tier")
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of one request; the last one has `finished` and a `finish_reason`."""

    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    pool: str
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the request asked

    def __post_init__(self) -> None:
        object.__setattr__(self, "logprobs", tuple(self.logprobs))


@dataclass(frozen=True, slots=True)
class Refusal:
    """The replica will not take the request now; another pool may, or the client retries."""

    reason: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class Failure:
    """The request cannot be served as it is (e.g. longer than max_model_len): an HTTP 4xx."""

    status: int
    message: str


ReplicaItem = Delta | Refusal | Failure


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole generation, as the handle API's `generate` returns it."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    num_prompt_tokens: int
    num_output_tokens: int
    pool: str

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_output_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_output_tokens,
        }


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A replica's identity and KV ledger, for operators and tests."""

    pool: str
    fingerprint: str
    warmup_s: float
    max_model_len: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_reserved: int
    running: int
    waiting: int
    live_requests: int
    pid: int


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """A replica's queue numbers, pushed to its app's forecast controller every routing period."""

    pool: str
    replica_id: str
    num_waiting: int = 0
    num_running: int = 0
    queue_wait_p99_s: float = 0.0
    kv_use_fraction: float = 0.0
