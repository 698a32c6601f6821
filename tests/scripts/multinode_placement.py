"""Run as a script (a separate Ray cluster cannot share the test session's): a 3-node
`ray.cluster_utils.Cluster` on this machine, with the pools' custom resources on two of the nodes,
deploys the app and prints, as JSON, on which node each replica and the controller landed.

    python tests/scripts/multinode_placement.py MODEL_DIR PORT
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main(model_dir: str, port: int) -> dict:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from autoscaling.controller import ensure_controller
    from serving.app import build_app
    from serving.config import AppConfig
    from serving.ray_internals import serve_controller
    from tests.integration.serve_helpers import app_args

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        hot = cluster.add_node(num_cpus=1, resources={"pool_hot": 1})
        cold = cluster.add_node(num_cpus=1, resources={"pool_cold": 2})
        ray.init(address=cluster.address, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        args = app_args(model_dir)
        args["pools"] = {
            "hot": {"num_replicas": 1, "resources": {"pool_hot": 1}},
            "cold": {
                "min_replicas": 0,
                "max_replicas": 2,
                "initial_replicas": 2,
                "resources": {"pool_cold": 1},
            },
        }
        started = time.monotonic()
        serve.run(build_app(args), name="placement", route_prefix="/placement")
        deploy_s = time.monotonic() - started
        controller = ensure_controller(
            AppConfig.from_args(
                {"controller": {"app_name": "placement-probe", "scaler": "external"}}
            )
        )
        ctl_node = ray.get(controller.status.remote(), timeout=60)["node_id"]
        ray.kill(controller, no_restart=True)
        serve_ctl = serve_controller()
        details = ray.get(serve_ctl.get_serve_instance_details.remote())
        deployments = details["applications"]["placement"]["deployments"]
        nodes = {"head": cluster.head_node.node_id, "hot": hot.node_id, "cold": cold.node_id}
        by_id = {v: k for k, v in nodes.items()}
        return {
            "deploy_s": round(deploy_s, 1),
            "replicas": {
                dep: sorted(by_id.get(r["node_id"], r["node_id"]) for r in info["replicas"])
                for dep, info in deployments.items()
            },
            "controller_node": by_id.get(ctl_node, ctl_node),
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
