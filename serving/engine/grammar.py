"""Grammars for structured output: a GrammarSpec compiled into an llguidance matcher.

llguidance (the library vLLM and SGLang also use) builds its token tables from our local fast
tokenizer (nothing is downloaded) and computes one bitmask of allowed tokens per step, one bit
per token id; serving/engine/sampler.py applies the masks of all constrained rows at once.
Torch-free, so the ingress can check a schema (a 400 naming the problem) before dispatch.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

from serving.engine.sampling_params import GrammarSpec

# Compact JSON with OpenAI's separators. llguidance's default lets any whitespace run between
# tokens, and a small model can then spend its whole budget on spaces and newlines.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# A matcher never raises on a bad grammar; it enters an error state. Creating one through
# `GrammarCompiler.matcher` checks first, so an engine never holds a broken matcher.


class GrammarError(ValueError):
    """The grammar (a JSON schema, a Lark grammar) cannot be compiled; the message says why."""


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar of a spec (not yet checked against a tokenizer)."""
    from llguidance import LLMatcher

    if spec.kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_STYLE)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except json.JSONDecodeError as err:
            raise GrammarError(f"the JSON schema is not valid JSON: {err}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError("the JSON schema must be an object (or true/false)")
        try:
            return LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)
        except ValueError as err:
            raise GrammarError(f"the JSON schema cannot be compiled: {err}") from None
    return LLMatcher.grammar_from_lark(spec.text)


class GrammarCompiler:
    """llguidance's view of one tokenizer (built once, ~0.5 s for a 49k vocabulary) and the
    compiled grammars of recent requests (a schema sent again compiles once)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self._ll_tokenizer = None

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance.hf

            if self._hf_tokenizer is None:
                raise GrammarError("structured output needs the model's tokenizer")
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer,
                n_vocab=self.vocab_size,
                eos_token=self.eos_token_ids or None,
            )
        return self._ll_tokenizer

    def warm(self) -> None:
        """Build the token tables now (at start-up), not inside the first constrained request."""
        if self._hf_tokenizer is not None:
            _ = self.ll_tokenizer

    def check(self, spec: GrammarSpec) -> str:
        """The compiled grammar; GrammarError naming the problem if the library refuses it."""
        return _checked(self, spec)

    def matcher(self, spec: GrammarSpec):
        """A fresh matcher for one sequence, at the start of the grammar."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer, self.check(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"grammar error: {matcher.get_error()}")
        return matcher


@functools.lru_cache(maxsize=256)
def _checked(compiler: GrammarCompiler, spec: GrammarSpec) -> str:
    from llguidance import LLMatcher

    text = grammar_text(spec)
    error = LLMatcher.validate_grammar(text, compiler.ll_tokenizer)
    if error:
        raise GrammarError(f"grammar error: {error.strip()}")
    return text
