"""OpenAI request validation (serving/api/openai.py): what common clients send is accepted."""

from __future__ import annotations

import pickle

import pytest

from serving.api import openai as p
from serving.api.errors import ApiError
from serving.api.http import validate
from serving.api.openai_fields import REFUSED

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def bad(kind, body: dict) -> ApiError:
    """The 400 that the routes would answer (validate() is what they call)."""
    with pytest.raises(ApiError) as info:
        validate(kind, body)
    assert info.value.status == 400
    return info.value


def test_fields_common_clients_send_are_accepted():
    req = validate(
        p.CompletionRequest,
        {
            "model": "m",
            "prompt": ["one prompt"],
            "max_completion_tokens": 9,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u-1",  # IGNORED: an end-user id
            "frequency_penalty": 0,
            "n": None,  # explicit nulls mean "unset", as the SDKs send them
        },
    )
    assert req.prompt == "one prompt" and req.requested_max_tokens() == 9
    assert req.stream_options.include_usage and req.stop == [] and req.num_choices == 1


def test_chat_content_as_text_parts():
    req = p.ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        }
    )
    assert [m.text() for m in req.messages] == ["be brief", "ab"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": ["a", "b"]}, "batched prompts"),
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "x", "n": 17}, "n: Input should be less than or equal to 16"),
        ({"prompt": "x", "best_of": 3}, "best_of=3"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo with logprobs"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "up to 4"),
        ({"prompt": "x", "priority": "vip"}, "priority='vip'"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias key 'abc'"),
        ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias[5]=101"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream: true"),
        ({"prompt": "x", "suffix": "after"}, "suffix"),
    ],
)
def test_invalid_completion_requests_name_the_problem(body, needle):
    assert needle in bad(p.CompletionRequest, body).message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("stream", 1),
        ("max_tokens", 5.0),
        ("max_tokens", "5"),
        ("n", True),
        ("temperature", "0.5"),
        ("seed", 1.5),
        ("ignore_eos", "false"),
        ("logprobs", True),
    ],
)
def test_types_are_strict_as_openai_is(field, value):
    err = bad(p.CompletionRequest, {"prompt": "x", field: value})
    assert err.message.startswith(field) and err.param.startswith(field)


def test_unknown_fields_are_a_400_naming_them_everywhere():
    err = bad(p.CompletionRequest, {"prompt": "x", "temprature": 0.5})
    assert "temprature: unknown field" in err.message and err.param == "temprature"
    msg = {"role": "user", "content": "hi", "mood": "happy"}
    assert (
        "messages.0.mood: unknown field"
        in bad(p.ChatCompletionRequest, {"messages": [msg]}).message
    )
    tool = {"type": "function", "function": {"name": "f", "parameter": {}}}
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [tool]}
    assert "tools.0.function.parameter" in bad(p.ChatCompletionRequest, body).message


@pytest.mark.parametrize(("field", "value"), [(f, "x") for f in REFUSED])
def test_every_unimplemented_field_is_a_400_naming_it(field, value):
    err = bad(
        p.ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], field: value}
    )
    assert err.message.startswith(f"{field}: ") and err.param == field


def test_unimplemented_fields_at_their_harmless_values_pass():
    body = {"messages": [{"role": "user", "content": "x"}], "store": False, "modalities": ["text"]}
    body |= {k: None for k in REFUSED} | {"store": False, "modalities": ["text"]}
    body |= {"metadata": {"k": "v"}, "prompt_cache_key": "c", "safety_identifier": "s"}
    validate(p.ChatCompletionRequest, body)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tool_choice": "required"}, "tools is empty"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "'g'"),
        ({"tools": [TOOL, TOOL]}, "unique"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools.0"),
        ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "json_schema is required"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"top_logprobs": 2}, "needs logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"service_tier": "gold"}, "service_tier"),
    ],
)
def test_invalid_chat_requests_name_the_problem(extra, needle):
    body = {"messages": [{"role": "user", "content": "x"}], **extra}
    assert needle in bad(p.ChatCompletionRequest, body).message


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ({"role": "wizard", "content": "x"}, "role"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, "'image_url'"),
        ({"role": "tool", "content": "42"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": []}, None),
        ({"role": "function", "content": "x", "name": "f"}, "role"),
    ],
)
def test_messages_are_checked_by_role(message, needle):
    body = {"messages": [message]}
    if needle is None:
        validate(p.ChatCompletionRequest, body)
    else:
        assert needle in bad(p.ChatCompletionRequest, body).message
    assert "at least one" in bad(p.ChatCompletionRequest, {"messages": []}).message


def test_a_whole_tool_conversation_validates():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = validate(
        p.ChatCompletionRequest,
        {
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "parallel_tool_calls": False,
            "response_format": {"type": "text"},
            "logprobs": True,
            "top_logprobs": 3,
        },
    )
    assert req.calls_tools and req.num_top_logprobs() == 3
    assert req.messages[1].tool_calls[0].function.arguments_object() == {}


def test_api_error_body_and_pickling():
    err = ApiError(
        429, "busy", type_="rate_limit_error", code="rate_limit_exceeded", retry_after_s=3.0
    )
    assert err.body() == {
        "error": {
            "message": "busy",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    back = pickle.loads(pickle.dumps(err))  # crosses Ray process boundaries intact
    assert (back.status, back.retry_after_s, back.body()) == (429, 3.0, err.body())


def test_usage_chunk_has_no_choices():
    chunk = p.usage_chunk("id", "m", 1, "chat.completion.chunk", 5, 7)
    assert chunk["choices"] == [] and chunk["usage"]["total_tokens"] == 12
