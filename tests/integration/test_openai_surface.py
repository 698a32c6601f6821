"""The OpenAI surface over real HTTP, driven by the openai SDK and checked with its own types.

Structured output, tool calls, sampling controls, logprobs, n, tiers and strict validation, each
streaming and not. A tiny random-weight model serves: its text is noise, so every check is one
that must hold whatever the model says (the grammar makes the JSON valid, the bias moves the
token); tests/integration/test_structured_output.py runs the embedded model.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

PORT = 18437
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": SCHEMA},
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
USER = [{"role": "user", "content": "weather in Paris for 3 days?"}]


@pytest.fixture(scope="module")
def client(ray_cluster, tmp_path_factory):
    from openai import OpenAI
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", arch="qwen2", seed=7)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    args = app_args(
        model_dir, pools={"cold": {"initial_replicas": 0}}, engine={"max_model_len": 1024}
    )
    deploy(args, name="openai_surface")
    yield OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", max_retries=0)
    # shutdown, not delete: a proxy left on this port would swallow the next module's serve.start
    serve.shutdown()


def strict(kind, obj):
    return kind.model_validate(obj.model_dump(), strict=True)


def test_json_schema_output_validates_streamed_and_not(client):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    for seed in range(4):
        out = client.chat.completions.create(
            model="tiny", messages=USER, response_format=fmt, max_tokens=80, seed=seed
        )
        strict(ChatCompletion, out)
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
        assert out.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=USER, response_format=fmt, max_tokens=80, seed=9, stream=True
        )
    )
    for c in chunks:
        strict(ChatCompletionChunk, c)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_a_schema_the_library_cannot_compile_is_a_400_naming_it(client):
    from openai import BadRequestError

    bad = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "objekt"}}}
    with pytest.raises(BadRequestError, match="objekt"):
        client.chat.completions.create(model="tiny", messages=USER, response_format=bad)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_always_returns_a_parseable_call(client, stream):
    for seed in range(5):
        calls, finish = _call_tools(client, stream, seed, tools=[WEATHER, CLOCK], choice="required")
        assert finish == "tool_calls" and calls
        for call in calls:
            args = json.loads(call["arguments"])
            assert call["id"].startswith("call_")
            jsonschema.validate(
                args, SCHEMA if call["name"] == "get_weather" else CLOCK["function"]["parameters"]
            )
    named = {"type": "function", "function": {"name": "get_time"}}
    calls, _ = _call_tools(client, stream, 1, tools=[WEATHER, CLOCK], choice=named, parallel=False)
    assert [c["name"] for c in calls] == ["get_time"]


def _call_tools(client, stream, seed, tools, choice, parallel=None):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    kw = dict(model="tiny", messages=USER, tools=tools, tool_choice=choice, max_tokens=400)
    kw |= {"seed": seed, "temperature": 1.0}
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    if not stream:
        out = strict(ChatCompletion, client.chat.completions.create(**kw))
        calls = out.choices[0].message.tool_calls or []
        found = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls
        ]
        return found, out.choices[0].finish_reason
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        strict(ChatCompletionChunk, chunk)
        choice0 = chunk.choices[0]
        finish = choice0.finish_reason or finish
        for d in choice0.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = d.id or slot["id"]
            slot["name"] += (d.function.name or "") if d.function else ""
            slot["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[k] for k in sorted(calls)], finish


def test_tool_results_go_back_through_the_template(client):
    from openai.types.chat import ChatCompletion

    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    out = client.chat.completions.create(
        model="tiny", messages=messages, tools=[CLOCK], max_tokens=8
    )
    strict(ChatCompletion, out)
    assert out.usage.prompt_tokens > 40  # the tool description, the call and its result


def test_logprobs_chat_and_completions_streamed_and_not(client):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    out = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    strict(ChatCompletion, out)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens and len(content[0].top_logprobs) == 3
    # greedy: the sampled token is the most likely one
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=USER, max_tokens=6, temperature=0, logprobs=True, stream=True
        )
    )
    for c in chunks:
        strict(ChatCompletionChunk, c)
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    comp = client.completions.create(
        model="tiny", prompt="def f(", max_tokens=5, logprobs=2, temperature=0
    )
    strict(Completion, comp)
    lp = comp.choices[0].logprobs
    assert (
        len(lp.tokens)
        == len(lp.token_logprobs)
        == len(lp.top_logprobs)
        == comp.usage.completion_tokens
    )


def test_sampling_controls_change_the_output(client):
    from serving.tiny_models import tiny_tokenizer

    def greedy(**kw):
        out = client.completions.create(
            model="tiny", prompt="import os", max_tokens=24, temperature=0, **kw
        )
        return out.choices[0].text

    base = greedy()
    assert greedy(frequency_penalty=2.0) != base or greedy(presence_penalty=2.0) != base
    assert greedy(extra_body={"repetition_penalty": 1.9}) != base
    # +100 on one token outweighs any logit: greedy picks it at every step
    out = client.completions.create(
        model="tiny", prompt="import os", max_tokens=4, temperature=0, logit_bias={"300": 100}
    )
    assert out.choices[0].text == tiny_tokenizer().decode([300] * 4)


def test_n_choices_with_a_seed_repeat(client):
    from openai.types.chat import ChatCompletion

    kw = dict(model="tiny", messages=USER, max_tokens=8, temperature=1.0, n=3, seed=11)
    a = strict(ChatCompletion, client.chat.completions.create(**kw))
    b = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len({c.message.content for c in a.choices}) > 1
    chunks = list(client.chat.completions.create(stream=True, **kw))
    texts = ["", "", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == [c.message.content for c in a.choices]


@pytest.mark.parametrize(
    ("extra", "status", "needle"),
    [
        ({"stream": "yes"}, 400, "stream"),
        ({"max_tokens": 5.5}, 400, "max_tokens"),
        ({"temprature": 0}, 400, "temprature: unknown field"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, 400, "audio"),
        ({"store": True}, 400, "store"),
        ({"priority": "urgent"}, 400, "priority"),
        ({"service_tier": "gold"}, 400, "service_tier"),
    ],
)
def test_strict_fields_over_http(client, extra, status, needle):
    body = {"model": "tiny", "messages": USER, "max_tokens": 2, **extra}
    r = httpx.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_service_tier_and_integer_priority(client):
    for tier, echoed in [("flex", "flex"), ("auto", "default"), ("priority", "priority")]:
        out = client.chat.completions.create(
            model="tiny", messages=USER, max_tokens=2, service_tier=tier
        )
        assert out.service_tier == echoed
    out = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=2,
        extra_body={"priority": 1, "top_k": 5, "min_p": 0.1},
    )
    assert out.choices[0].finish_reason in ("stop", "length")
