"""Run as a script (its own Ray cluster, with or without a dashboard): scale a deployment of an
app deployed with external_scaler_enabled through autoscaling.serve_io.ServeScaler from inside an
actor, as the controller does, and print which path it used and the counts Serve reached.

    python tests/scripts/serve_scaler_paths.py dash|nodash PORT
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(with_dashboard: bool, port: int) -> dict:
    import ray
    from ray import serve

    extra = {"dashboard_port": _free_port()} if with_dashboard else {}
    ray.init(
        num_cpus=1,
        include_dashboard=with_dashboard,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        **extra,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Echo:
        def __call__(self) -> str:
            return "ok"

    serve.run(Echo.options(name="cold").bind(), name="x", route_prefix="/x",
              external_scaler_enabled=True)  # fmt: skip

    @ray.remote(num_cpus=0)
    def scale_and_watch() -> dict:
        from autoscaling.serve_io import ServeScaler, dashboard_url, read_counts

        scaler = ServeScaler("x", dashboard_url)
        seen = {}
        for target in (2, 0):
            scaler.scale("cold", target)
            for _ in range(120):
                counts = read_counts("x")["cold"]
                if counts.running == target and counts.live == target:
                    break
                time.sleep(0.5)
            seen[target] = [counts.running, counts.live]
        return {"path": scaler.path_used, "counts": seen}

    try:
        return ray.get(scale_and_watch.remote(), timeout=120)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] == "dash", int(sys.argv[2]))))
