"""SamplingParams: what a request asks of the decoder. Torch-free: it crosses to the ingress."""

from __future__ import annotations

from dataclasses import dataclass

from common.validate import check_choice, check_range

_OWNER = "SamplingParams"
GRAMMAR_KINDS = ("json_object", "json_schema", "lark")
MAX_LOGPROBS = 20  # OpenAI's top_logprobs ceiling


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A constraint on the output, compiled by serving/engine/grammar.py.

    json_object  any JSON object (`text` unused)
    json_schema  `text` is a JSON schema, serialised
    lark         `text` is an llguidance Lark grammar (tool calls, serving/llm/tools.py)
    """

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        check_choice("GrammarSpec", "kind", self.kind, GRAMMAR_KINDS)
        if not isinstance(self.text, str):
            raise ValueError(f"GrammarSpec.text={self.text!r} must be a string")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding. temperature 0 is greedy; top_k 0, top_p 1, min_p 0, penalties 0
    (repetition 1) and no logit_bias disable those steps. Penalties and logit_bias apply to greedy
    rows too, as OpenAI applies them whatever the temperature."""

    # None: generate until EOS or max_model_len. In reserve mode a request reserves KV for
    # prompt + max_tokens, so an explicit cap admits more requests at once (R8).
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # OpenAI's: subtract presence * [token seen in the output] + frequency * count(token).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's / HF's: logits of tokens seen in prompt or output divided (> 0) or multiplied (< 0).
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    # None: no logprobs; k >= 0: the sampled token's logprob and the k most likely tokens'.
    logprobs: int | None = None
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            check_range(_OWNER, "max_tokens", self.max_tokens, 1, None, integer=True)
        check_range(_OWNER, "temperature", self.temperature, 0.0, 2.0)
        check_range(_OWNER, "top_p", self.top_p, 0.0, 1.0, lo_open=True)
        check_range(_OWNER, "top_k", self.top_k, 0, None, integer=True)
        check_range(_OWNER, "min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            check_range(_OWNER, "seed", self.seed, 0, 2**63 - 1, integer=True)
        check_range(_OWNER, "presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_range(_OWNER, "frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        check_range(_OWNER, "repetition_penalty", self.repetition_penalty, 0.0, 2.0, lo_open=True)
        if self.logprobs is not None:
            check_range(_OWNER, "logprobs", self.logprobs, 0, MAX_LOGPROBS, integer=True)
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise ValueError(f"{_OWNER}.grammar={self.grammar!r} must be a GrammarSpec or None")
        # Accept any iterable but store tuples, so the object stays hashable and frozen.
        stops = tuple(self.stop_token_ids)
        for t in stops:
            check_range(_OWNER, "stop_token_ids[]", t, 0, None, integer=True)
        object.__setattr__(self, "stop_token_ids", stops)
        bias = tuple((t, b) for t, b in dict(self.logit_bias).items())
        for t, b in bias:
            check_range(_OWNER, "logit_bias key", t, 0, None, integer=True)
            check_range(_OWNER, f"logit_bias[{t}]", b, -100.0, 100.0)
        object.__setattr__(self, "logit_bias", bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
