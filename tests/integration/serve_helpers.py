"""Helpers shared by the Serve integration tests: app args, deploy, readiness, replica stats.

Everything runs against the session's real local Ray cluster (tests/integration/conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import httpx

from serving.llm.messages import ReplicaInfo


def app_args(model_dir, **overrides) -> dict:
    """A small but real configuration: tiny model, 8 MiB KV, 1 hot + 1 cold replica."""
    args = {
        "model": {"source": str(model_dir), "served_name": "tiny"},
        "engine": {
            "kv_cache_bytes": 8 * 2**20,
            "max_model_len": 512,
            "block_size_tokens": 16,
            "max_num_seqs": 16,
            "min_num_seqs": 4,
        },
        "pools": {
            "hot": {"num_replicas": 1},
            "cold": {"min_replicas": 0, "max_replicas": 2, "initial_replicas": 1},
        },
        "replica": {
            "num_cpus": 0,
            "torch_threads": 1,
            "graceful_shutdown_timeout_s": 20,
            "health_check_period_s": 2,
        },
    }
    for section, values in overrides.items():
        args.setdefault(section, {}).update(values)
    return args


OVERLOAD_TTFT_SLO_S = 1.0


def overload_args(model_dir) -> dict:
    """The overload app (tests/integration/test_overload.py, benchmarks/hardening.py): two
    replicas of 2 sequences each, so capacity is set by the engine and 10x of it is what the HTTP
    front door (proxy + ingress, Python, on the same 2 cores) can still answer. The interactive
    queue bound is loose (8): the TTFT prediction decides admission, not the count. Serve's
    per-replica limit (8) and the planned capacity per replica (3 req/s, as measured here) size
    the ingress's bounded front door (serving/config/front_door.py)."""
    return app_args(
        model_dir,
        engine={"max_model_len": 256, "max_num_seqs": 2, "min_num_seqs": 2},
        tiers={
            "interactive": {"max_waiting": 8, "ttft_p99_s": OVERLOAD_TTFT_SLO_S},
            "offline": {"max_waiting": 8},
        },
        replica={"max_ongoing_requests": 8},
        controller={"enabled": False, "replica_capacity_rps": 3.0},
    )


def deploy(
    args,
    name: str = "tideserve",
    route_prefix: str = "/",
    *,
    env: Mapping[str, Mapping] | None = None,
    pools_running: tuple = (),
):
    """Deploy and wait until the ingress serves. `env` maps a deployment name ("ingress", "hot",
    "cold") to environment variables of its replicas (API keys, fault hooks). With
    `pools_running` the app counts as up once those deployments run, even if another failed."""
    from ray.serve.api import _run

    app = build_app_with_env(args, env or {})
    _run(app, name=name, route_prefix=route_prefix, _blocking=False)
    wait_ready(name, pools_running=pools_running)


def build_app_with_env(args: dict, env: Mapping[str, Mapping]):
    """serving.app.build_app, with per-deployment environment variables: what an operator sets
    with a runtime_env in cluster.yaml, and how tests inject faults into one pool only."""
    from serving.app import build_graph
    from serving.config import AppConfig

    return build_graph(AppConfig.from_args(args), env)


def wait_ready(name: str, timeout_s: float = 180.0, pools_running: tuple = ()) -> None:
    """The ingress answers a handle call (its watcher has polled the pools once)."""
    from ray import serve

    handle = serve.get_app_handle(name)
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        ok = status is not None and (
            str(status.status).endswith("RUNNING")
            or (pools_running and all(running_replicas(name, p) > 0 for p in pools_running))
        )
        if ok:
            try:
                handle.generate.remote("warm", max_tokens=1).result(timeout_s=30)
                return
            except Exception as err:  # not up yet; reported if it never comes up
                last_error = err
        time.sleep(1.0)
    raise TimeoutError(
        f"app {name} not ready after {timeout_s} s ({last_error!r}): {serve.status()}"
    )


def running_replicas(app: str, deployment: str) -> int:
    from serving.serve_status import running_replicas as running

    return running(app).get(deployment, 0)


def replica_infos(app: str, pools=("hot", "cold")) -> dict[str, ReplicaInfo]:
    """info() of one replica per pool that has a running replica."""
    from ray import serve

    return {
        pool: serve.get_deployment_handle(pool, app).info.remote().result(timeout_s=60)
        for pool in pools
        if running_replicas(app, pool) > 0
    }


def kv_state(info: ReplicaInfo) -> dict:
    return {k: getattr(info, k) for k in KV_KEYS}


KV_KEYS = ("kv_blocks_used", "kv_blocks_reserved", "running", "waiting", "live_requests")
IDLE = dict.fromkeys(KV_KEYS, 0)


def wait_idle(app: str, pools=("hot", "cold"), timeout_s: float = 20.0) -> dict[str, dict]:
    """Poll until every pool's replica holds no KV and no request; returns the last states."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {pool: kv_state(info) for pool, info in replica_infos(app, pools).items()}
        if all(s == IDLE for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def sse_frames(response: httpx.Response) -> list[str]:
    raw = "".join(response.iter_text())
    return [f.removeprefix("data: ") for f in raw.split("\n\n") if f]
