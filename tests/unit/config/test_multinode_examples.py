"""The multi-node examples parse, pass Ray's and our own schemas, and agree on pool resources.

examples/serve-multinode.yaml is the Serve config; examples/kuberay-rayservice.yaml embeds it as
serveConfigV2; examples/ray-cluster.yaml (cluster launcher) and the RayService's worker groups must
offer the custom resources its pools ask for, in amounts that fit the pool sizes.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

from serving.config import AppConfig, load_cluster_yaml

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
SERVE = EXAMPLES / "serve-multinode.yaml"
LAUNCHER = EXAMPLES / "ray-cluster.yaml"
RAYSERVICE = EXAMPLES / "kuberay-rayservice.yaml"


@pytest.fixture(scope="module")
def app_cfg() -> AppConfig:
    return load_cluster_yaml(SERVE)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_serve_config_is_valid_for_serve_and_for_us(app_cfg):
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(yaml.safe_load(SERVE.read_text()))
    (app,) = schema.applications
    # Our controller scales through Serve's external scaler, which needs the flag and (checked by
    # Serve's schema above) no autoscaling_config on any deployment.
    assert app.external_scaler_enabled is True
    assert app_cfg.controller.enabled and app_cfg.controller.app_name == app.name
    assert dict(app_cfg.pools.hot.resources) == {"pool_hot": 1.0}
    assert dict(app_cfg.pools.cold.resources) == {"pool_cold": 1.0}
    assert app_cfg.replica.num_gpus == 1.0


def _launcher() -> dict:
    return yaml.safe_load(LAUNCHER.read_text())


def test_cluster_launcher_config_passes_rays_schema():
    import jsonschema
    import ray

    schema_path = os.path.join(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json")
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.validate(_launcher(), schema)
    broken = _launcher()
    broken["available_node_types"]["gpu_cold"]["min_workerz"] = 0
    with pytest.raises(jsonschema.ValidationError, match="min_workerz"):
        jsonschema.validate(broken, schema)


def _fits(node_resources: dict, replica_resources: dict, num_gpus: float) -> int:
    """Replicas of one pool a node can hold, by its pool resource and its GPUs."""
    ((name, amount),) = replica_resources.items()
    by_pool = node_resources.get(name, 0) // amount
    by_gpu = node_resources.get("GPU", 0) // num_gpus if num_gpus else by_pool
    return int(min(by_pool, by_gpu))


def test_cluster_launcher_node_types_match_the_pools(app_cfg):
    cfg = _launcher()
    types = cfg["available_node_types"]
    hot, cold = app_cfg.pools.hot, app_cfg.pools.cold
    gpus = app_cfg.replica.num_gpus
    head = types[cfg["head_node_type"]]["resources"]
    assert not {"pool_hot", "pool_cold", "GPU"} & set(head)  # no replica on the head
    hot_type = next(t for t in types.values() if "pool_hot" in t["resources"])
    cold_type = next(t for t in types.values() if "pool_cold" in t["resources"])
    # Hot: always on, enough for every hot replica. Cold: from zero, enough for max_replicas.
    assert hot_type["min_workers"] == hot_type["max_workers"] >= 1
    assert hot_type["min_workers"] * _fits(hot_type["resources"], hot.resources, gpus) >= (
        hot.num_replicas
    )
    assert cold_type["min_workers"] == 0
    assert cold_type["max_workers"] * _fits(cold_type["resources"], cold.resources, gpus) >= (
        cold.max_replicas
    )
    assert "pool_cold" not in hot_type["resources"] and "pool_hot" not in cold_type["resources"]


def _rayservice() -> dict:
    return yaml.safe_load(RAYSERVICE.read_text())


def _group_resources(group: dict) -> dict:
    """rayStartParams.resources is KubeRay's quoted JSON string, plus the container's GPUs."""
    raw = group["rayStartParams"]["resources"]
    resources = json.loads(json.loads(raw))  # '"{\"pool_hot\": 1}"' -> {"pool_hot": 1}
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    resources["GPU"] = float(limits.get("nvidia.com/gpu", 0))
    return resources


def test_rayservice_embeds_the_same_serve_config(app_cfg):
    doc = _rayservice()
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    embedded = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load(SERVE.read_text())
    assert AppConfig.from_args(embedded["applications"][0]["args"]) == app_cfg


def test_rayservice_worker_groups_match_the_pools(app_cfg):
    cluster = _rayservice()["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["rayVersion"] == "2.60.0"
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    hot, cold = groups["gpu-hot"], groups["gpu-cold"]
    gpus = app_cfg.replica.num_gpus
    assert hot["minReplicas"] == hot["maxReplicas"] == hot["replicas"] >= 1
    assert hot["minReplicas"] * _fits(_group_resources(hot), app_cfg.pools.hot.resources, gpus) >= (
        app_cfg.pools.hot.num_replicas
    )
    assert cold["minReplicas"] == cold["replicas"] == 0
    assert cold["maxReplicas"] * _fits(
        _group_resources(cold), app_cfg.pools.cold.resources, gpus
    ) >= (app_cfg.pools.cold.max_replicas)
    head_params = cluster["headGroupSpec"]["rayStartParams"]
    assert head_params.get("num-gpus") == "0" and "resources" not in head_params
