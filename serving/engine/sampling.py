"""SamplingParams and the sampler: greedy rows in one argmax, sampled rows one by one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving._validate import check_range

_OWNER = "SamplingParams"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding. temperature 0 is greedy; top_k 0 and top_p 1 disable those cuts."""

    # None: generate until EOS or max_model_len. In reserve mode a request reserves KV for
    # prompt + max_tokens, so an explicit cap admits more requests at once (R8).
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            check_range(_OWNER, "max_tokens", self.max_tokens, 1, None, integer=True)
        check_range(_OWNER, "temperature", self.temperature, 0.0, 2.0)
        check_range(_OWNER, "top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range(_OWNER, "top_k", self.top_k, 0, None, integer=True)
        if self.seed is not None:
            check_range(_OWNER, "seed", self.seed, 0, 2**63 - 1, integer=True)
        # Accept any iterable of ints but store a tuple, so the object stays hashable and frozen.
        stops = tuple(self.stop_token_ids)
        for t in stops:
            check_range(_OWNER, "stop_token_ids[]", t, 0, None, integer=True)
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private generator for seeded sampled requests: the same seed gives the same text."""
    if params.greedy or params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


def _sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One next token per row of `logits` [rows, vocab]."""
    greedy_ids = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            greedy_ids[i] = _sample_row(logits[i], p, generators[i])
    return greedy_ids
