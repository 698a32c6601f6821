"""Tool calls and replies without a server: prompts, grammars, parsing, and OpenAI's own types.

Replies are built from hand-made replica deltas and validated strictly with the openai SDK's
models, chunk by chunk, so the shapes are OpenAI's whatever the model says.
"""

from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serving.api import openai as p
from serving.api.http import validate
from serving.engine.grammar import GrammarCompiler
from serving.engine.outputs import TokenLogprob
from serving.llm import tools
from serving.llm.choices import ChoiceState, TokenText
from serving.llm.messages import Delta
from serving.llm.replies import Reply

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def chat(**extra) -> p.ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "weather in Paris?"}], **extra}
    return validate(p.ChatCompletionRequest, body)


def delta(text: str, finished=False, reason=None, logprobs=()) -> Delta:
    return Delta(text, (1,) * max(1, len(logprobs)), finished, reason, 5, 3, "hot", logprobs)


def test_plan_follows_tool_choice():
    assert tools.plan_for(chat()) is None
    assert tools.plan_for(chat(tools=[WEATHER], tool_choice="none")) is None
    auto = tools.plan_for(chat(tools=[WEATHER, TIME]))
    assert auto.mode == "auto" and auto.parallel and not auto.forced
    named = tools.plan_for(
        chat(
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )
    )
    assert named.names() == {"get_time"} and len(named.all_functions) == 2
    assert tools.grammar_for(auto) is None


def test_forced_grammar_accepts_only_calls_to_the_allowed_tools(tokenizer):
    plan = tools.plan_for(chat(tools=[WEATHER, TIME], tool_choice="required"))
    compiler = GrammarCompiler(tokenizer, 512, [2])
    ok = tools.call_text("get_weather", {"city": "Paris", "days": 2})
    for text, accepted in [
        (ok, True),
        (ok + "\n" + tools.call_text("get_time", {}), True),
        (tools.call_text("get_weather", {"city": "Paris"}), False),  # misses "days"
        (tools.call_text("delete_all", {}), False),
        ("Sure! " + ok, False),
    ]:
        matcher = compiler.matcher(tools.grammar_for(plan))
        consumed = matcher.consume_tokens(tokenizer(text).input_ids)
        assert (consumed and matcher.is_accepting()) == accepted, text
    single = tools.plan_for(
        chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    )
    matcher = compiler.matcher(tools.grammar_for(single))
    matcher.consume_tokens(tokenizer(ok).input_ids)
    assert matcher.is_stopped()  # one call, and nothing may follow it


def test_tools_reach_a_template_without_tool_support_as_a_system_message():
    req = chat(
        tools=[WEATHER],
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    plan = tools.plan_for(req)
    turns = tools.render_turns(req.messages, plan, native=False)
    assert turns[0]["content"].startswith("be brief") and '"get_weather"' in turns[0]["content"]
    assert turns[2]["content"] == tools.call_text("get_weather", {"city": "Paris"})
    assert turns[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    native = tools.render_turns(req.messages, plan, native=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tools.tools_kwarg(plan)[0]["function"]["name"] == "get_weather"


def test_tool_stream_splits_content_and_calls_across_any_chunking():
    plan = tools.plan_for(chat(tools=[WEATHER]))
    text = "Let me check." + tools.call_text("get_weather", {"city": "Oslo", "days": 1}) + " Done."
    for size in (1, 3, 7, len(text)):
        stream = tools.ToolStream(plan)
        out = []
        for i in range(0, len(text), size):
            out += stream.feed(text[i : i + size])
        out += stream.finish()
        content = "".join(x for x in out if isinstance(x, str))
        calls = [x for x in out if isinstance(x, tools.Call)]
        assert content == "Let me check. Done."
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", {"city": "Oslo", "days": 1})
        ]
    junk = tools.ToolStream(plan)
    assert "".join(junk.feed("<tool_call>not json</tool_call><tool")) == (
        "<tool_call>not json</tool_call>"
    )
    assert junk.finish() == ["<tool"]


def reply(req, plan=None, n=1) -> Reply:
    from serving.tiny_models import tiny_tokenizer

    return Reply(
        rid="chatcmpl-1" if isinstance(req, p.ChatCompletionRequest) else "cmpl-1",
        model="m",
        req=req,
        states=[ChoiceState(i, plan) for i in range(n)],
        token_text=TokenText(tiny_tokenizer()),
        extra={"service_tier": "default"},
    )


def test_streamed_and_collected_tool_calls_are_openai_shaped():
    req = chat(tools=[WEATHER], tool_choice="required", stream=True)
    plan = tools.plan_for(req)
    text = tools.call_text("get_weather", {"city": "Rome", "days": 3})
    streamed = reply(req, plan)
    frames = streamed.opening()
    for i in range(0, len(text), 9):
        piece = text[i : i + 9]
        last = i + 9 >= len(text)
        frames += streamed.frames(0, delta(piece, last, "stop" if last else None))
    for f in frames:
        ChatCompletionChunk.model_validate(f, strict=True)
    calls = [c for f in frames for c in (f["choices"][0]["delta"].get("tool_calls") or [])]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Rome", "days": 3}
    assert frames[-1]["choices"][0]["finish_reason"] == "tool_calls"
    collected = reply(req, plan)
    collected.states[0].feed(delta(text, True, "stop"))
    body = ChatCompletion.model_validate(collected.response(), strict=True)
    (call,) = body.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and body.choices[0].finish_reason == "tool_calls"
    assert body.service_tier == "default"


def test_logprobs_and_n_choices_are_openai_shaped(tokenizer):
    ids = tokenizer("hello world").input_ids
    lps = tuple(TokenLogprob(t, -0.5, ((t, -0.5), (7, -1.25))) for t in ids)
    req = chat(logprobs=True, top_logprobs=2, n=2, stream=True)
    r = reply(req, n=2)
    frames = r.opening() + r.frames(1, delta("hello world", True, "length", lps))
    frames += r.frames(0, delta("", True, "stop"))
    for f in frames:
        ChatCompletionChunk.model_validate(f, strict=True)
    content = frames[2]["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == "hello world"
    assert content[0]["top_logprobs"][1]["logprob"] == -1.25
    ChatCompletionChunk.model_validate(r.usage_frame(), strict=True)
    comp = validate(p.CompletionRequest, {"prompt": "x", "logprobs": 2, "n": 2})
    c = reply(comp, n=2)
    c.states[0].feed(delta("hello world", True, "length", lps))
    c.states[1].feed(delta("", True, "stop"))
    body = Completion.model_validate(c.response(), strict=True)
    assert body.choices[0].logprobs.text_offset[:2] == [0, len(TokenText(tokenizer)(ids[0]))]
    assert body.usage.completion_tokens == 6


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_choice_required_grammar_compiles_for_every_plan(tokenizer, parallel):
    req = chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel)
    GrammarCompiler(tokenizer, 512, [2]).check(tools.grammar_for(tools.plan_for(req)))
