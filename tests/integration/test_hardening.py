"""Hardening: bad input over HTTP and handles, the API key on every endpoint, the body cap, and
prompts kept out of logs. After all of it the server is healthy and holds no KV (R8, R10).

One app with an API key, a 256-token max_model_len and a 64 KiB body cap, on 127.0.0.1:18700.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import IDLE, app_args, deploy, sse_frames, wait_idle

pytestmark = pytest.mark.integration

APP = "hard"
PORT = 18700
KEY = "sk-test-" + uuid.uuid4().hex
KEY_ENV = "TIDESERVE_TEST_API_KEY"
AUTH = {"authorization": f"Bearer {KEY}"}
CANARY = "zq" + uuid.uuid4().hex[:12]  # a prompt word that must never reach a log file


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", arch="qwen2", seed=7)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    args = app_args(
        model_dir,
        engine={"max_model_len": 256},
        server={"api_key_env": KEY_ENV, "max_body_bytes": 65536, "max_tokens_limit": 1000},
    )
    deploy(args, APP, env={"ingress": {KEY_ENV: KEY}})
    yield {"base": f"http://127.0.0.1:{PORT}"}
    serve.shutdown()


def _raw(text: str) -> dict:
    return {"content": text.encode("utf-8", "surrogatepass")}


C, H = "/v1/completions", "/v1/chat/completions"
OK_CHAT = [{"role": "user", "content": "hi"}]

# (case id, path, request kwargs, status, what the error message must name)
BAD_INPUT = [
    ("malformed_json", C, {"content": b"{not json"}, 400, "not valid JSON"),
    ("body_is_a_list", C, {"content": b"[1, 2]"}, 400, "JSON object"),
    ("invalid_utf8", C, {"content": b'{"model": "tiny", "prompt": "\xff\xfe"}'}, 400, "JSON"),
    ("nested_too_deep", C, {"content": b"[" * 60000}, 400, "nested too deeply"),
    ("integer_too_long", C, _raw('{"prompt": "x", "max_tokens": ' + "9" * 5000 + "}"), 400, "JSON"),
    ("lone_surrogate", C, _raw('{"model": "tiny", "prompt": "a\\ud800"}'), 400, "invalid Unicode"),
    ("missing_prompt", C, {"json": {"model": "tiny"}}, 400, "prompt"),
    ("missing_messages", H, {"json": {"model": "tiny"}}, 400, "messages"),
    ("prompt_wrong_type", C, {"json": {"prompt": 42}}, 400, "prompt"),
    ("max_tokens_wrong_type", C, {"json": {"prompt": "x", "max_tokens": "ten"}}, 400, "max_tokens"),
    ("max_tokens_negative", C, {"json": {"prompt": "x", "max_tokens": -1}}, 400, "max_tokens"),
    ("max_tokens_zero", C, {"json": {"prompt": "x", "max_tokens": 0}}, 400, "max_tokens"),
    ("max_tokens_fraction", C, {"json": {"prompt": "x", "max_tokens": 1.5}}, 400, "max_tokens"),
    ("max_tokens_huge", C, {"json": {"prompt": "x", "max_tokens": 10**9}}, 400, "max_tokens"),
    ("prompt_too_long", C, {"json": {"prompt": "x " * 600}}, 400, "max_model_len"),
    ("prompt_plus_max_tokens", C, {"json": {"prompt": "x", "max_tokens": 300}}, 400,
     "max_model_len"),
    ("chat_too_long", H, {"json": {"messages": [{"role": "user", "content": "y " * 600}]}}, 400,
     "max_model_len"),
    ("empty_prompt", C, {"json": {"prompt": ""}}, 400, "prompt is empty"),
    ("empty_token_list", C, {"json": {"prompt": []}}, 400, "prompt is empty"),
    ("batched_prompts", C, {"json": {"prompt": ["a", "b"]}}, 400, "batched"),
    ("token_id_out_of_vocab", C, {"json": {"prompt": [10**6]}}, 400, "out of range"),
    ("empty_messages", H, {"json": {"messages": []}}, 400, "messages"),
    ("unknown_role", H, {"json": {"messages": [{"role": "wizard", "content": "x"}]}}, 400, "role"),
    ("content_wrong_type", H, {"json": {"messages": [{"role": "user", "content": 5}]}}, 400,
     "content"),
    ("unknown_model", C, {"json": {"model": "gpt-9", "prompt": "x"}}, 404, "does not exist"),
    ("temperature_negative", C, {"json": {"prompt": "x", "temperature": -0.5}}, 400, "temperature"),
    ("temperature_too_high", C, {"json": {"prompt": "x", "temperature": 9}}, 400, "temperature"),
    ("temperature_nan", C, {"content": b'{"prompt": "x", "temperature": NaN}'}, 400, "temperature"),
    ("top_p_zero", H, {"json": {"messages": OK_CHAT, "top_p": 0}}, 400, "top_p"),
    ("top_p_above_one", H, {"json": {"messages": OK_CHAT, "top_p": 1.5}}, 400, "top_p"),
    ("top_k_negative", C, {"json": {"prompt": "x", "top_k": -2}}, 400, "top_k"),
    ("seed_negative", C, {"json": {"prompt": "x", "seed": -1}}, 400, "seed"),
    ("n_too_many", H, {"json": {"messages": OK_CHAT, "n": 17}}, 400, "n: "),
    ("top_logprobs_alone", H, {"json": {"messages": OK_CHAT, "top_logprobs": 2}}, 400,
     "top_logprobs"),
    ("unknown_field", H, {"json": {"messages": OK_CHAT, "temprature": 0}}, 400, "temprature"),
    ("unimplemented_field", H, {"json": {"messages": OK_CHAT, "audio": {}}}, 400, "audio"),
    ("too_many_stops", C, {"json": {"prompt": "x", "stop": list("abcde")}}, 400, "stop"),
    ("stream_wrong_type", C, {"json": {"prompt": "x", "stream": [1]}}, 400, "stream"),
    ("stream_as_string", C, {"json": {"prompt": "x", "stream": "yes"}}, 400, "stream"),
    ("unknown_tier_field", C, {"json": {"prompt": "x", "priority": "urgent"}}, 400, "priority"),
    ("unknown_tier_header", C, {"json": {"prompt": "x"}, "headers": {"x-priority": "vip"}}, 400,
     "priority"),
    ("oversized_body", C, {"json": {"prompt": "x" * 70000}}, 413, "65536-byte limit"),
    ("oversized_chunked_body", C, {"content": iter([b'{"prompt": "'] + [b"x" * 8192] * 10)}, 413,
     "65536-byte limit"),
    ("bad_api_key", C, {"json": {"prompt": "x"}, "headers": {"authorization": "Bearer nope"}},
     401, "API key"),
    ("missing_api_key", H, {"json": {"messages": OK_CHAT}, "headers": {"authorization": ""}}, 401,
     "API key"),
    ("key_without_bearer", C, {"json": {"prompt": "x"}, "headers": {"authorization": KEY}}, 401,
     "API key"),
    ("unknown_endpoint", "/v1/embeddings", {"json": {"input": "x"}}, 404, "Not Found"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "needle"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
def test_bad_input_gets_a_4xx_with_an_openai_error_naming_the_problem(
    served, path, kwargs, status, needle
):
    headers = {**AUTH, "content-type": "application/json", **kwargs.get("headers", {})}
    headers = {k: v for k, v in headers.items() if v}  # "" means: leave the header out
    request = {k: v for k, v in kwargs.items() if k != "headers"}
    r = httpx.post(served["base"] + path, headers=headers, timeout=30, **request)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"], err
    assert isinstance(err["type"], str) and err["type"]


def test_wrong_method_is_a_405_with_an_openai_error(served):
    r = httpx.get(served["base"] + C, headers=AUTH, timeout=30)
    assert r.status_code == 405 and "Method Not Allowed" in r.json()["error"]["message"]


HANDLE_BAD_INPUT = [
    ("max_tokens_negative", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("temperature_out_of_range", {"prompt": "x", "temperature": 5.0}, "temperature"),
    ("unknown_tier", {"prompt": "x", "priority": "urgent"}, "priority"),
    ("empty_prompt", {"prompt": ""}, "prompt is empty"),
    ("prompt_wrong_type", {"prompt": 3.5}, "prompt"),
    ("prompt_too_long", {"prompt": "x " * 600}, "max_model_len"),
    ("misspelled_argument", {"prompt": "x", "temprature": 0.5}, "temprature"),
    ("max_tokens_huge", {"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
]


@pytest.mark.parametrize(
    ("kwargs", "needle"), [c[1:] for c in HANDLE_BAD_INPUT], ids=[c[0] for c in HANDLE_BAD_INPUT]
)
def test_bad_handle_calls_raise_a_400_api_error_naming_the_problem(served, kwargs, needle):
    from ray import serve

    from serving.api.errors import ApiError

    handle = serve.get_app_handle(APP)
    with pytest.raises(ApiError) as info:
        handle.generate.remote(**kwargs).result(timeout_s=60)
    assert info.value.status == 400 and needle in info.value.message, info.value


def test_after_bad_input_and_a_dropped_stream_the_server_is_healthy_and_holds_no_kv(served):
    base = served["base"]
    body = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + C, json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # one frame, then the client goes away mid-generation
    assert httpx.get(base + "/health", timeout=30).json()["status"] == "ok"
    ok = httpx.post(base + C, json={"prompt": "def", "max_tokens": 4}, headers=AUTH, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    states = wait_idle(APP)
    assert set(states) == {"hot", "cold"}
    assert all(state == IDLE for state in states.values()), states


def test_every_endpoint_but_health_needs_the_key(served):
    base = served["base"]
    calls = [
        ("GET", "/v1/models", None),
        ("POST", C, {"prompt": "x", "max_tokens": 2}),
        ("POST", H, {"messages": OK_CHAT, "max_tokens": 2}),
        ("POST", C, {"prompt": "x", "max_tokens": 2, "stream": True}),
    ]
    for method, path, body in calls:
        for header in ({}, {"authorization": "Bearer " + KEY[:-1]}, {"authorization": "Basic x"}):
            r = httpx.request(method, base + path, json=body, headers=header, timeout=30)
            assert r.status_code == 401, (path, header, r.status_code)
            assert r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.request(method, base + path, json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, (path, r.text[:300])
    # /health stays open for load-balancer probes and says nothing beyond pool availability.
    health = httpx.get(base + "/health", timeout=30).json()
    assert health == {"status": "ok", "pools": {"hot": True, "cold": True}}


def test_prompts_and_completions_stay_out_of_the_logs(served):
    """Send a canary word through success, stream and refusal paths, then read every log file
    of the Ray session: the canary and the completions must not be there, while the ids of
    those requests are (so the check reads live, flushed logs)."""
    import time

    base, prompt = served["base"], f"{CANARY} tell me about {CANARY}"
    texts = []
    r = httpx.post(base + C, json={"prompt": prompt, "max_tokens": 24}, headers=AUTH, timeout=60)
    texts.append(r.json()["choices"][0]["text"])
    chat = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "stream": True}
    with httpx.stream("POST", base + H, json=chat, headers=AUTH, timeout=60) as resp:
        frames = [json.loads(f) for f in sse_frames(resp)[:-1]]
    texts.append("".join(f["choices"][0]["delta"].get("content", "") for f in frames[1:]))
    too_long = {"prompt": prompt + " x" * 600}
    refused = httpx.post(base + C, json=too_long, headers=AUTH, timeout=30)
    assert refused.status_code == 400
    # Serve logs every request with its id: those ids in the logs prove they are flushed and read.
    request_ids = [r.headers["x-request-id"], refused.headers["x-request-id"]]
    time.sleep(2)  # let log handlers flush
    from serving.ray_internals import logs_dir as ray_logs_dir

    logs_dir = ray_logs_dir()
    corpus = "\n".join(f.read_text(errors="replace") for f in logs_dir.rglob("*") if f.is_file())
    assert all(rid in corpus for rid in request_ids)  # positive control
    assert CANARY not in corpus
    for text in texts:
        if len(text.strip()) >= 12:  # long enough that a chance match is impossible
            assert text not in corpus
    assert any(len(t.strip()) >= 12 for t in texts), texts
