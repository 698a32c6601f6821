"""Pre-warmed cold replicas bring up a cold node, released after the peak (Ray's fake autoscaler).

Starts a private Ray cluster on this machine with Ray's fake multi-node autoscaler
(`RAY_FAKE_CLUSTER=1`, no Docker): a head, an always-on "gpu_hot" node type offering {pool_hot: 1}
and a "gpu_cold" type from 0 to 2 nodes offering {pool_cold: 1}. The app runs with
examples/serve-multinode.yaml's pool resources (on CPU, with a tiny model) and the forecast
controller plays the e2e test's compressed day (time_scale 300: one model hour = 12 s) with the
three previous days injected as history. A client drives HTTP traffic along the day shape.

Reported (JSON): when cold nodes appeared and disappeared relative to the ramp (12:00) and the end
of the peak (14:00), the cold starts the controller measured (they include the node launch here),
and zero failed requests. Nothing else on the machine is touched: the cluster's processes are found
by its private temp dir and only they are stopped (never `ray stop`, which stops every cluster).

    .venv/bin/python benchmarks/fake_cluster_cold_node.py --quick --json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import write_json  # noqa: E402

HTTP_PORT = 18502
APP = "autoscale-e2e"  # the name the e2e helpers use


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def autoscaler_config(gcs_address: str, idle_timeout_minutes: float) -> dict:
    def node(resources: dict, lo: int, hi: int) -> dict:
        return {"resources": resources, "node_config": {}, "min_workers": lo, "max_workers": hi}

    return {
        "cluster_name": "tideserve_fake",
        "max_workers": 4,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": gcs_address,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            # The same pool resources as examples/ray-cluster.yaml, minus the GPU (CPU machine).
            "gpu_hot": node({"CPU": 1, "pool_hot": 1}, 1, 1),
            "gpu_cold": node({"CPU": 1, "pool_cold": 1}, 0, 2),
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def start_cluster(temp_dir: str, idle_timeout_minutes: float) -> str:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    cfg_path = os.path.join(temp_dir, "autoscaler.json")
    with open(cfg_path, "w") as f:
        json.dump(autoscaler_config(address, idle_timeout_minutes), f)
    env = {
        **os.environ,
        "RAY_FAKE_CLUSTER": "1",
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",  # a private throwaway cluster on 127.0.0.1
        "PYTHONPATH": str(ROOT),
    }
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    cmd = [
        ray_bin, "start", "--head", f"--port={port}", "--num-cpus=1",
        "--node-ip-address=127.0.0.1", "--include-dashboard=false",
        f"--temp-dir={temp_dir}", f"--autoscaling-config={cfg_path}",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=ROOT)
    return address


def stop_cluster(temp_dir: str) -> int:
    """SIGTERM, then SIGKILL, every process whose command line names this cluster's temp dir."""
    mine = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if temp_dir.encode() in f.read():
                    mine.append(int(pid))
        except OSError:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(2)
    return len(mine)


def cold_nodes_alive() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("pool_cold", 0) > 0)


def run_day(address: str, work: pathlib.Path, past_cold_start_s: float) -> dict:
    import ray
    from ray import serve

    from autoscaling.controller import get_controller
    from autoscaling.serve_io import read_counts
    from serving.app import build_app
    from serving.tiny_models import save_tiny_model_dir
    from tests.integration import test_autoscaling_e2e as day

    ray.init(address=address, log_to_driver=False)
    model_dir = save_tiny_model_dir(work / "tiny", arch="qwen2", seed=7)
    history = work / "history.json"
    day.write_past_days(history, cold_start_s=past_cold_start_s)
    args = day.app_args(model_dir)
    args["pools"] = {
        "hot": {"num_replicas": 1, "resources": {"pool_hot": 1}},
        "cold": {
            "min_replicas": 0,
            "max_replicas": 2,
            "initial_replicas": 0,
            "resources": {"pool_cold": 1},
        },
    }
    # the external-scaler option: this benchmark reads the controller actor's status
    args["controller"] = {**day.controller_section(history), "scaler": "external"}
    args["tiers"] = {"interactive": {"ttft_p99_s": 10.0}}
    serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT}, proxy_location="HeadOnly")
    started = time.time()
    serve.run(build_app(args), name=APP, route_prefix="/e2e", external_scaler_enabled=True)
    deploy_s = time.time() - started
    ctrl = get_controller(APP)
    deadline = time.time() + 300
    status = ray.get(ctrl.status.remote())
    while status["clock"] is None and time.time() < deadline:
        time.sleep(0.5)
        status = ray.get(ctrl.status.remote())
    client = day.DayClient(f"http://127.0.0.1:{HTTP_PORT}/e2e", status["clock"])
    thread = threading.Thread(target=client.run)
    thread.start()
    timeline = []
    try:
        while day.hour(client.model_now()) < day.END_HOUR + 0.5:  # + time for the node release
            counts = read_counts(APP)
            timeline.append(
                {
                    "model_hour": round(day.hour(client.model_now()), 3),
                    "cold_running": counts["cold"].running,
                    "cold_live": counts["cold"].live,
                    "cold_nodes": cold_nodes_alive(),
                }
            )
            time.sleep(1.0)
    finally:
        client.stop.set()
        thread.join(timeout=60)
        client.close()
    status = ray.get(ctrl.status.remote())
    serve.shutdown()
    ray.shutdown()
    return summarise(timeline, client.results, status, deploy_s)


def _rises(timeline: list[dict], key: str) -> list[float]:
    """Model hours at which timeline[key] went up from the previous sample."""
    return [cur["model_hour"] for prev, cur in itertools.pairwise(timeline) if cur[key] > prev[key]]


def summarise(timeline: list[dict], results: list, status: dict, deploy_s: float) -> dict:
    """The day's events in model hours. The first sample may still show the cold node that
    Serve's initial cold replica brought up at deploy time (Serve refuses 0 replicas)."""
    after_peak = [p for p in timeline if p["model_hour"] >= 14.0]
    released = next((p["model_hour"] for p in after_peak if p["cold_nodes"] == 0), None)
    nodes_added = _rises(timeline, "cold_nodes")
    ready = _rises(timeline, "cold_running")
    failures = [r for r in results if r != 200]
    return {
        "ramp_starts_hour": 12.0,
        "peak_ends_hour": 14.0,
        "time_scale": status["clock"]["time_scale"] if status["clock"] else None,
        "deploy_s": round(deploy_s, 1),
        "cold_nodes_at_start": timeline[0]["cold_nodes"] if timeline else None,
        "cold_target_raised_hours": _rises(timeline, "cold_live"),
        "cold_node_added_hours": nodes_added,
        "cold_replica_ready_hours": ready,
        "max_cold_nodes": max((p["cold_nodes"] for p in timeline), default=0),
        "cold_replicas_drained_hour": next(
            (p["model_hour"] for p in after_peak if p["cold_live"] == 0), None
        ),
        "cold_nodes_released_hour": released,
        "cold_node_added_before_ramp": bool(nodes_added) and nodes_added[0] < 12.0,
        "max_cold_running_before_ramp": max(
            (p["cold_running"] for p in timeline if p["model_hour"] < 12.0), default=0
        ),
        "cold_pool_full_hour": next(
            (p["model_hour"] for p in timeline if p["cold_running"] >= 2), None
        ),
        "cold_nodes_released_after_peak": released is not None,
        "cold_start_samples_s": status["cold_start_samples_s"],
        "cold_start_note": "the first sample is the injected history (yesterday's); the others "
        "were measured today (target raised -> replica running), node launch included",
        "num_requests": len(results),
        "num_failed_requests": len(failures),
        "failures": failures[:5],
        "timeline": timeline,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 s node idle timeout (else 30 s)")
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument(
        "--past-cold-start-s",
        type=float,
        default=20.0,
        help="cold start in the injected history (real s); 20 s is what a first run measured "
        "with the node launch on this 2-CPU machine",
    )
    args = parser.parse_args(argv)
    temp_dir = tempfile.mkdtemp(prefix="tsfake", dir="/tmp")  # short: Ray's socket paths
    work = pathlib.Path(temp_dir) / "work"
    work.mkdir()
    os.environ["RAY_AUTH_MODE"] = "disabled"  # this driver joins the private cluster below
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        address = start_cluster(temp_dir, idle_timeout_minutes=0.1 if args.quick else 0.5)
        day = run_day(address, work, args.past_cold_start_s)
    finally:
        num_stopped = stop_cluster(temp_dir)
    result = {"benchmark": "fake_cluster_cold_node", "quick": args.quick, **day}
    result["num_processes_stopped"] = num_stopped
    print(json.dumps({k: v for k, v in result.items() if k != "timeline"}, indent=2))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
