"""OpenAI request validation (serving/api/openai.py): what common clients send is accepted."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from serving.api import openai as p
from serving.api.errors import ApiError


def test_fields_common_clients_send_are_accepted():
    req = p.CompletionRequest.model_validate(
        {
            "model": "m",
            "prompt": ["one prompt"],
            "max_completion_tokens": 9,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "user": "u-1",
            "frequency_penalty": 0,  # unknown to us: ignored, like other OpenAI-compatible servers
        }
    )
    assert req.prompt == "one prompt" and req.requested_max_tokens() == 9
    assert req.stream_options.include_usage and req.stop == []


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
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "n": 2}, "n=2"),
        ({"prompt": "x", "logprobs": 3}, "logprobs"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "up to 4"),
        ({"prompt": "x", "priority": "vip"}, "priority='vip'"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
    ],
)
def test_invalid_completion_requests_name_the_problem(body, needle):
    with pytest.raises(ValidationError, match=needle):
        p.CompletionRequest.model_validate(body)


def test_empty_messages_and_unknown_roles_are_rejected():
    with pytest.raises(ValidationError, match="at least one message"):
        p.ChatCompletionRequest.model_validate({"messages": []})
    with pytest.raises(ValidationError, match="role"):
        p.ChatCompletionRequest.model_validate({"messages": [{"role": "wizard", "content": "x"}]})


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
