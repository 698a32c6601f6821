"""The Serve application end to end on a real local Ray cluster, over real HTTP on 127.0.0.1.

A tiny random-weight model directory stands in for the embedded model, so replicas start in
seconds; everything else is what `serve run cluster.yaml` deploys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

APP = "tideserve"


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", arch="qwen2", seed=7)
    port = 18431
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(app_args(model_dir))
    yield {"base": f"http://127.0.0.1:{port}", "model_dir": model_dir, "port": port}
    serve.shutdown()


def test_openai_sdk_completions_and_chat_validate_strictly(served):
    from openai import OpenAI
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    client = OpenAI(base_url=served["base"] + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]

    comp = client.completions.create(
        model="tiny", prompt="def main():", max_tokens=8, temperature=0
    )
    Completion.model_validate(comp.model_dump(), strict=True)
    _assert_usage_counts_real_tokens(served, comp)

    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
    )
    ChatCompletion.model_validate(chat.model_dump(), strict=True)
    assert chat.choices[0].message.role == "assistant"

    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for c in chunks:
        ChatCompletionChunk.model_validate(c.model_dump(), strict=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content  # greedy: stream equals non-stream
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    )


def test_sse_framing_and_done(served):
    body = {
        "model": "tiny",
        "prompt": "import os",
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", served["base"] + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        raw = "".join(r.iter_text())
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    last = json.loads(frames[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "tiny", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "temperature": 9}, 400, "temperature"),
        ({"model": "tiny", "prompt": "x", "n": 17}, 400, "n: "),
        ({"model": "nope", "prompt": "x"}, 404, "does not exist"),
        ({"model": "tiny", "prompt": "x " * 600, "max_tokens": 8}, 400, "max_model_len"),
        ({"model": "tiny"}, 400, "prompt"),
        ({"model": "tiny", "prompt": "x", "priority": "urgent"}, 400, "priority"),
    ],
)
def test_bad_input_gets_openai_error_body(served, body, status, needle):
    r = httpx.post(served["base"] + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"]


def _assert_usage_counts_real_tokens(served, comp) -> None:
    """usage counts the tokens the model read and generated, not characters or a constant: the
    same greedy request through the handle returns its token ids, and the tokenizer counts the
    prompt."""
    from ray import serve
    from transformers import AutoTokenizer

    usage, choice = comp.usage, comp.choices[0]
    same = (
        serve.get_app_handle(APP)
        .generate.remote("def main():", max_tokens=8, temperature=0)
        .result(timeout_s=60)
    )
    assert choice.text == same.text  # greedy: one answer, whatever the path
    assert usage.completion_tokens == len(same.token_ids)
    tokenizer = AutoTokenizer.from_pretrained(served["model_dir"])
    assert usage.prompt_tokens == len(tokenizer("def main():").input_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 8
    else:
        assert choice.finish_reason == "stop" and 1 <= usage.completion_tokens <= 8


def test_malformed_json_is_a_400(served):
    r = httpx.post(
        served["base"] + "/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_handle_call_from_a_second_driver(served):
    import ray

    # the test's own cluster by its address: "auto" would take whichever cluster registered last
    address = ray.get_runtime_context().gcs_address
    script = textwrap.dedent(f"""
        import json, ray
        from ray import serve
        ray.init(address="{address}", log_to_driver=False)
        h = serve.get_app_handle("{APP}")
        out = h.generate.remote("def main():", max_tokens=6, priority="analytical",
                                temperature=0).result(timeout_s=60)
        parts = list(h.options(stream=True).generate_stream.remote("def main():", max_tokens=6,
                     temperature=0))
        print(json.dumps({{"pool": out.pool, "completion_tokens": out.usage["completion_tokens"],
                          "text": out.text, "stream_text": "".join(p.text for p in parts)}}))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["pool"] == "cold"  # analytical goes to the cold pool first
    assert result["completion_tokens"] >= 1
    assert result["stream_text"] == result["text"]


def test_interactive_overflows_to_cold_then_429_when_all_full(served):
    from ray import serve

    # Hot takes at most one waiting interactive request; a burst must overflow to cold.
    deploy(
        app_args(
            served["model_dir"],
            tiers={"interactive": {"max_waiting": 1}},
            # the replicas' overflow and refusal are the subject, not the ingress's queue bound
            # (test_overload.py covers that); the derived bound would drop this burst first
            server={"ingress_max_queued_requests": 64},
            engine={
                "kv_cache_bytes": 8 * 2**20,
                "max_model_len": 512,
                "max_num_seqs": 1,
                "min_num_seqs": 1,
            },
        ),
        name="overflow",
        route_prefix="/overflow",
    )
    handle = serve.get_app_handle("overflow")
    responses = [
        handle.generate.remote("x", max_tokens=40, temperature=0, ignore_eos=True) for _ in range(8)
    ]
    pools, refused = [], 0
    for resp in responses:
        try:
            pools.append(resp.result(timeout_s=120).pool)
        except Exception as err:  # the burst may exceed both pools: that is a 429
            assert "saturated" in str(err)
            refused += 1
    assert "hot" in pools and "cold" in pools
    # Over HTTP, a burst larger than both pools gets 429 with Retry-After.
    url = served["base"] + "/overflow/v1/completions"
    body = {"model": "tiny", "prompt": "x", "max_tokens": 60, "ignore_eos": True}
    with httpx.Client(timeout=120) as c:
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda _: c.post(url, json=body), range(12)))
    codes = [r.status_code for r in results]
    assert 429 in codes and 200 in codes, codes
    too_many = next(r for r in results if r.status_code == 429)
    assert int(too_many.headers["retry-after"]) >= 1
    assert too_many.json()["error"]["code"] == "rate_limit_exceeded"
    serve.delete("overflow")


def test_scale_down_under_load_fails_no_request(served):
    """R9: scale-down stops new traffic, lets in-flight requests finish, then releases."""
    import threading

    from ray import serve

    two_hot = {
        "hot": {"num_replicas": 2},
        "cold": {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0},
    }
    deploy(
        # a generous ingress queue: scale-down under load is the subject, not the front door
        app_args(served["model_dir"], pools=two_hot, server={"ingress_max_queued_requests": 64}),
        name="scaledown",
        route_prefix="/scaledown",
    )
    handle = serve.get_app_handle("scaledown")
    results: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                out = handle.generate.remote(
                    "x", max_tokens=30, temperature=0, ignore_eos=True
                ).result(timeout_s=120)
                results.append(out.finish_reason)
            except Exception as err:  # recorded, and the test fails on it below
                results.append(f"FAILED: {err!r}"[:300])

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    one_hot = {**two_hot, "hot": {"num_replicas": 1}}
    from serving.app import build_app

    serve.run(
        build_app(
            app_args(served["model_dir"], pools=one_hot, server={"ingress_max_queued_requests": 64})
        ),
        name="scaledown",
        route_prefix="/scaledown",
        blocking=False,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        dep = serve.status().applications["scaledown"].deployments["hot"]
        if dep.replica_states.get("RUNNING") == 1 and sum(dep.replica_states.values()) == 1:
            break
        time.sleep(0.5)
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(timeout=150)
    failures = [r for r in results if r.startswith("FAILED")]
    assert len(results) >= 8, results
    assert not failures, failures[:3]
    assert serve.status().applications["scaledown"].deployments["hot"].replica_states == {
        "RUNNING": 1
    }
    serve.delete("scaledown")


def test_hot_and_cold_run_one_configuration_and_are_warm(served):
    """R9/R10: both groups carry the same config fingerprint; ready means warmed up."""
    from ray import serve

    from serving.config import AppConfig

    expected = AppConfig.from_args(app_args(served["model_dir"])).replica_fingerprint()
    infos = {
        pool: serve.get_deployment_handle(pool, APP).info.remote().result(timeout_s=60)
        for pool in ("hot", "cold")
    }
    assert {i.fingerprint for i in infos.values()} == {expected}
    assert infos["hot"].pool == "hot" and infos["cold"].pool == "cold"
    assert all(i.warmup_s > 0 and i.kv_blocks_total > 0 for i in infos.values())
    assert all(i.startup.load_s > 0 and i.startup.total_s == i.warmup_s for i in infos.values())
    assert httpx.get(served["base"] + "/health", timeout=30).json()["pools"] == {
        "hot": True,
        "cold": True,
    }
