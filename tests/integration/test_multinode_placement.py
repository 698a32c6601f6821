"""Hot replicas land on the hot node group and cold replicas on the cold one (decision 3 in
docs/design.md).

A multi-node `ray.cluster_utils.Cluster` (head + a node offering {pool_hot: 1} + a node offering
{pool_cold: 2}) runs in a subprocess: it is a separate Ray cluster and cannot share the session's.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from serving.tiny_models import save_tiny_model_dir

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
PORT = 18501


def test_pools_are_placed_on_their_node_groups(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "tiny", arch="qwen2", seed=7)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    # Its own process group: on a timeout the script and the nodes it started are stopped
    # together, not left running on a machine other jobs share.
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/scripts/multinode_placement.py"), str(model_dir),
         str(PORT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["replicas"]["hot"] == ["hot"], result
    assert result["replicas"]["cold"] == ["cold", "cold"], result
    # The ingress and the forecast controller are pinned to the head: neither may sit on a cold
    # node that the autoscaler releases after the peak.
    assert result["replicas"]["ingress"] == ["head"], result
    assert result["controller_node"] == "head", result
