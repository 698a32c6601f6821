"""The benchmarks' variants of cluster.yaml differ from it only where their comment says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from serving.config import load_cluster_yaml

ROOT = Path(__file__).resolve().parents[3]


def test_the_2x1_variant_changes_only_the_hot_pool_size_and_the_replica_threads():
    base = load_cluster_yaml(ROOT / "cluster.yaml")
    variant = load_cluster_yaml(ROOT / "benchmarks" / "configs" / "cluster_2x1.yaml")
    assert variant.pools.hot.num_replicas == 2
    assert (variant.replica.num_cpus, variant.replica.torch_threads) == (1.0, 1)
    undone = dataclasses.replace(
        variant,
        pools=dataclasses.replace(
            variant.pools, hot=dataclasses.replace(variant.pools.hot, num_replicas=1)
        ),
        replica=dataclasses.replace(variant.replica, num_cpus=2.0, torch_threads=2),
    )
    assert undone == base


def test_the_2x1_variant_keeps_the_shipped_serve_settings_and_applications():
    def serve_level(path: Path) -> dict:
        doc = yaml.safe_load(path.read_text())
        for app in doc["applications"]:
            if app["name"] == "tideserve":  # its args were compared above, as validated configs
                app.pop("args")
                app.pop("autoscaling_policy")  # its kwargs alias the args
        return doc

    base = serve_level(ROOT / "cluster.yaml")
    assert serve_level(ROOT / "benchmarks" / "configs" / "cluster_2x1.yaml") == base
