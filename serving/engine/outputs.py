"""What the engine hands back: whole results, streamed deltas, and the errors a caller can catch."""

from __future__ import annotations

from dataclasses import dataclass, field


class RequestTimeoutError(TimeoutError):
    """The request waited in the queue past its deadline; nothing ran, nothing is held."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an error; the replica should be replaced."""


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probability of one sampled token under the model, and the `top` most likely
    (token id, logprob) pairs at that position, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "abort" | "timeout"
    num_preemptions: int = 0
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per output token, when asked for


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """New tokens of one request since the last delta; `finished` on the last one."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    queue_wait_s: float | None = None  # arrival to admission, once admitted
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of token_ids, when asked for
