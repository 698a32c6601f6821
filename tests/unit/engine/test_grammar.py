"""Structured output in the engine: a random-weight model's output obeys the grammar anyway."""

from __future__ import annotations

import json

import jsonschema
import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.grammar import GrammarCompiler, GrammarError
from serving.engine.sampling_params import GrammarSpec
from serving.tiny_models import tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tokenizer):
    cfg = EngineConfig(num_kv_blocks=128, block_size_tokens=8, max_model_len=512)
    return LLMEngine(tiny_model("llama", seed=5), tokenizer, cfg)


def test_json_schema_output_validates_for_every_prompt_greedy_and_sampled(engine):
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    prompts = [[5 + i, 6, 7 + 2 * i] for i in range(8)]
    params = [
        SamplingParams(max_tokens=200, temperature=t, seed=i, grammar=spec)
        for i, t in enumerate([0.0, 0.7, 1.0, 1.3] * 2)
    ]
    free = SamplingParams(max_tokens=20, temperature=1.0, seed=1)  # unconstrained rows beside
    outs = engine.generate(prompts + prompts[:2], [*params, free, free])
    for out in outs[:8]:
        assert out.finish_reason == "stop", out
        jsonschema.validate(json.loads(out.text), SCHEMA)
    engine.check_integrity()


def test_json_object_and_a_lark_grammar(engine, tokenizer):
    # A random model rambles inside strings; a bias on "}" (which the grammar allows only where
    # an object may close) shows bias and mask compose: the first place it may close, it does.
    close = tokenizer.convert_tokens_to_ids("}")
    any_object = SamplingParams(
        max_tokens=120, temperature=0, grammar=GrammarSpec("json_object"), logit_bias={close: 100}
    )
    (obj,) = engine.generate([[9, 9, 9]], any_object)
    assert obj.finish_reason == "stop" and json.loads(obj.text) == {}
    lark = GrammarSpec("lark", 'start: "<call>" ("yes" | "no") "</call>"')
    (out,) = engine.generate([[3, 4]], SamplingParams(max_tokens=30, temperature=0, grammar=lark))
    assert out.text in ("<call>yes</call>", "<call>no</call>") and out.finish_reason == "stop"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (GrammarSpec("json_schema", '{"type": "objec"}'), "objec"),
        (GrammarSpec("json_schema", "{not json"), "not valid JSON"),
        (GrammarSpec("json_schema", '{"$ref": "#/nowhere"}'), "nowhere"),
        (GrammarSpec("lark", "start: missing_rule"), "missing_rule"),
    ],
)
def test_a_grammar_the_library_refuses_is_an_error_naming_the_problem(engine, spec, needle):
    with pytest.raises(GrammarError, match=needle):
        engine.add_request([1, 2], SamplingParams(grammar=spec))


def test_the_tokenizer_tables_are_built_offline_from_the_local_tokenizer(tokenizer):
    compiler = GrammarCompiler(tokenizer, 512, [2])
    assert compiler.ll_tokenizer.decode_str(tokenizer("hello").input_ids) == "hello"
