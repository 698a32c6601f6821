"""Replica start-up, deploy to ready, by phase: what every scale-up waits for.

    python benchmarks/cold_start.py [--quick] [--json PATH] [--warm-trials N]

Deploys the app (one hot replica of the embedded default model, no cold pool) on a private local
Ray cluster, waits until Serve reports it running, reads the replica's constructor phases
(serving/llm/startup.py: setup, resolve, load, self_check, warm) and deletes it; again for each
trial. The first trial runs with an empty model cache (TIDESERVE_CACHE in a fresh folder: the
embedded GGUF is converted to safetensors, as on a node's first start), the others with the cache
the first wrote (every later start on that node). outside_constructor_s = deploy-to-ready minus
the constructor's total: Ray placing the actor, starting a worker process, importing torch and
this package, and Serve's own bookkeeping (the ingress starts beside it, in parallel).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _common as c

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray

APP, HTTP_PORT = "cold_start", 18510
APP_ARGS = {
    "pools": {
        "hot": {"num_replicas": 1},
        "cold": {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0},
    },
    "replica": {"num_cpus": 0},
}


def one_start(label: str) -> dict:
    """Deploy, wait until running, read the hot replica's phases, delete."""
    from ray import serve

    from serving.app import build_app

    t0 = time.perf_counter()
    serve.run(build_app(APP_ARGS), name=APP, route_prefix="/")  # returns once the app runs
    ready_s = time.perf_counter() - t0
    info = serve.get_deployment_handle("hot", APP).info.remote().result(timeout_s=60)
    serve.delete(APP)
    phases = info.startup.as_dict()
    row = {
        "trial": label,
        "deploy_to_ready_s": ready_s,
        "constructor_s": info.startup.total_s,
        "outside_constructor_s": ready_s - info.startup.total_s,
        "phases_s": phases,
    }
    c.log(
        f"{label}: ready in {ready_s:.1f} s; "
        + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
    )
    return row


def summarize(rows: list[dict]) -> dict:
    warm = [r for r in rows if r["trial"].startswith("warm")]
    out = {"cold_cache_deploy_to_ready_s": rows[0]["deploy_to_ready_s"]}
    if warm:
        out["warm_cache_deploy_to_ready_s_median"] = statistics.median(
            r["deploy_to_ready_s"] for r in warm
        )
        out["warm_cache_phases_s_median"] = {
            k: statistics.median(r["phases_s"][k] for r in warm) for k in warm[0]["phases_s"]
        }
        out["warm_cache_outside_constructor_s_median"] = statistics.median(
            r["outside_constructor_s"] for r in warm
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one warm trial")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--warm-trials", type=int, default=3)
    args = ap.parse_args()
    warm_trials = 1 if args.quick else args.warm_trials
    if warm_trials < 1:
        raise SystemExit(f"--warm-trials={warm_trials} must be >= 1")

    cache = tempfile.mkdtemp(prefix="tideserve-cold-start-")
    env = {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "TIDESERVE_CACHE": cache}
    os.environ.update(env)  # before ray starts: raylet and every worker inherit it
    import ray
    from ray import serve

    c.start_local_ray()
    rows = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT})
        rows.append(one_start("cold_cache"))
        rows += [one_start(f"warm_cache_{i + 1}") for i in range(warm_trials)]
    finally:
        serve.shutdown()
        ray.shutdown()
    report = {
        "benchmark": "cold_start",
        "quick": args.quick,
        "machine": c.machine_info("cpu", "auto (replica's)"),
        "model": "embedded default (SmolLM2-135M-Instruct), replica defaults of cluster.yaml",
        "trials": rows,
        "summary": summarize(rows),
        "notes": __doc__.split("\n\n", 2)[2].strip(),
    }
    print(report["summary"])
    if args.json:
        c.write_json(args.json, report)


if __name__ == "__main__":
    main()
