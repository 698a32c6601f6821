"""The engine's SamplingParams of a validated OpenAI request: OpenAI's defaults where unset, the
server's max_tokens bounds, and grammars checked before dispatch (a 400, not a replica error)."""

from __future__ import annotations

import dataclasses

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.config import AppConfig
from serving.engine.grammar import GrammarCompiler, GrammarError
from serving.engine.sampling_params import GrammarSpec, SamplingParams


class RequestParams:
    def __init__(self, config: AppConfig, grammars: GrammarCompiler) -> None:
        self.config = config
        self.grammars = grammars

    def params(
        self, req: p._SamplingFields, num_prompt_tokens: int, grammar=None
    ) -> SamplingParams:
        """The engine's SamplingParams of a validated request (OpenAI's defaults where unset)."""
        srv = self.config.server
        limit = self.config.engine.max_model_len
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            room = (limit - num_prompt_tokens) if limit else srv.default_max_tokens
            max_tokens = max(1, min(srv.default_max_tokens, room))
        elif max_tokens > srv.max_tokens_limit:
            raise ApiError(
                400,
                f"max_tokens={max_tokens} is out of range; allowed: 1 <= "
                f"max_tokens <= {srv.max_tokens_limit}",
                param="max_tokens",
            )
        source = req.grammar_source()
        if grammar is None and source is not None:
            grammar = self.checked_grammar(GrammarSpec(*source), "response_format")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(0, req.top_k or 0),
            min_p=req.min_p or 0.0,
            seed=req.seed,
            ignore_eos=bool(req.ignore_eos),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=req.repetition_penalty or 1.0,
            logit_bias=tuple((int(k), v) for k, v in (req.logit_bias or {}).items()),
            logprobs=req.num_top_logprobs(),
            grammar=grammar,
        )

    def checked_grammar(self, spec: GrammarSpec, field: str) -> GrammarSpec:
        """A grammar the library cannot compile is a 400 naming the problem, before dispatch."""
        try:
            self.grammars.check(spec)
        except GrammarError as err:
            raise ApiError(400, f"{field}: {err}", param=field) from None
        return spec


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n choices are n sequences; a seeded request seeds choice i with seed + i, so the
    choices differ from each other and the whole reply repeats."""
    if n == 1 or params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + i) % 2**63) for i in range(n)]


# The sampling arguments the handle API (Ingress.generate) accepts besides prompt, max_tokens and
# priority: HTTP ignores unknown fields, a Python caller that passes one made a typo. `model`
# names a served LoRA adapter (or the base model), as it does over HTTP.
HANDLE_SAMPLING_KEYS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "ignore_eos",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "response_format",
        "service_tier",
    }
)
