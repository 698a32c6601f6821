"""One real local Ray cluster per test session, bound to 127.0.0.1, no dashboard."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(
        # "local": always a cluster of our own; a bare init attaches to any cluster still
        # registered on this machine (another run's, or one shutting down) and then refuses num_cpus
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}},
    )
    yield ray
    ray.shutdown()
