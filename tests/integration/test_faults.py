"""Faults (R9, R10): a replica killed mid-stream, and a replica that fails its warm-up self-check.

Scale-down under load with zero failed requests is in test_serve_app.py; the forecast controller
killed and restarted with its history is in test_autoscaling_e2e.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import httpx
import pytest

from serving.llm.replica import FAIL_SELF_CHECK_ENV
from serving.tiny_models import SMALL_LLAMA, save_tiny_model_dir
from tests.integration.serve_helpers import (
    IDLE,
    app_args,
    deploy,
    running_replicas,
    wait_idle,
)

pytestmark = pytest.mark.integration

PORT = 18710
NO_COLD = {"hot": {"num_replicas": 1}, "cold": {"initial_replicas": 0, "max_replicas": 1}}


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    # The 3 M-parameter Llama: slow enough per token (ms) that a long stream is still running
    # when the replica is killed.
    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "small", **SMALL_LLAMA)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    yield {"base": f"http://127.0.0.1:{PORT}", "model_dir": model_dir}
    serve.shutdown()


def replica_actor_names(app: str, deployment: str) -> list[str]:
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    names = ray.util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in names if a["name"].startswith(prefix)]


def test_replica_killed_mid_stream_fails_cleanly_and_is_replaced(served):
    import ray

    args = app_args(
        served["model_dir"],
        engine={"max_model_len": 2048, "kv_cache_bytes": 32 * 2**20},
        pools=NO_COLD,
    )
    deploy(args, "killed", "/killed")
    url = served["base"] + "/killed/v1/completions"
    long = {"prompt": "x", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
    (victim,) = replica_actor_names("killed", "hot")

    with cf.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as client:
        plain = pool.submit(lambda: (client.post(url, json=long), time.monotonic()))
        frames: list[str] = []
        with client.stream("POST", url, json={**long, "stream": True}) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line)
            frames += [next(lines) for _ in range(3)]  # generation is under way
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            killed_at = time.monotonic()
            frames += list(lines)
            stream_ended_s = time.monotonic() - killed_at
        answer, answered_at = plain.result(timeout=60)

    # The stream ends with an error event and [DONE], within seconds, not a hang.
    assert stream_ended_s < 10, stream_ended_s
    assert frames[-1] == "data: [DONE]"
    error = json.loads(frames[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and error["code"] == "replica_failed"
    assert len(frames) < 1500  # it did not run to completion somewhere
    # The non-streaming request in flight gets a clean 503 with an OpenAI body and Retry-After.
    assert answer.status_code == 503, answer.text[:300]
    assert answer.json()["error"]["code"] == "replica_failed"
    assert int(answer.headers["retry-after"]) >= 1
    assert answered_at - killed_at < 10

    # Serve replaces the replica; later requests succeed on the new one.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        names = replica_actor_names("killed", "hot")
        if names and victim not in names and running_replicas("killed", "hot") == 1:
            break
        time.sleep(0.5)
    replaced_s = time.monotonic() - killed_at
    assert victim not in replica_actor_names("killed", "hot"), "the dead replica was not replaced"
    short = {"prompt": "x", "max_tokens": 8}
    codes = [httpx.post(url, json=short, timeout=60).status_code for _ in range(5)]
    assert codes == [200] * 5, codes
    assert wait_idle("killed", pools=("hot",))["hot"] == IDLE
    print(f"stream ended {stream_ended_s:.2f} s after the kill; replaced in {replaced_s:.1f} s")
    from ray import serve

    serve.delete("killed")


def test_replica_failing_its_self_check_never_gets_traffic(served):
    """The cold replica's warm-up generation fails (injected); Serve never marks it running, the
    ingress never routes to it, and cold-first (analytical) traffic is served by hot."""
    from ray import serve

    args = app_args(served["model_dir"], engine={"max_model_len": 256})
    deploy(
        args,
        "badwarm",
        "/badwarm",
        env={"cold": {FAIL_SELF_CHECK_ENV: "1"}},
        pools_running=("ingress", "hot"),
    )
    deadline = time.monotonic() + 90
    message = ""
    while time.monotonic() < deadline and "self-check failed" not in message:
        time.sleep(1)
        message = serve.status().applications["badwarm"].deployments["cold"].message
    assert "self-check failed" in message, message[-500:]

    url = served["base"] + "/badwarm/v1/completions"
    body = {"prompt": "x", "max_tokens": 4, "priority": "analytical"}  # cold first, then hot
    codes = [httpx.post(url, json=body, timeout=60).status_code for _ in range(6)]
    assert codes == [200] * 6
    handle = serve.get_app_handle("badwarm")
    pools = {
        handle.generate.remote("x", max_tokens=2, priority="analytical").result(timeout_s=60).pool
        for _ in range(4)
    }
    assert pools == {"hot"}
    assert running_replicas("badwarm", "cold") == 0
    health = httpx.get(served["base"] + "/badwarm/health", timeout=30).json()
    assert health["pools"] == {"hot": True, "cold": False}
    serve.delete("badwarm")
