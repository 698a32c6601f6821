"""SamplingParams: what a request asks of the decoder. Torch-free: it crosses to the ingress."""

from __future__ import annotations

from dataclasses import dataclass

from common.validate import check_range

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
