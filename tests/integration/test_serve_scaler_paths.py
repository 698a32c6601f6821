"""Serve's external scaling API works both ways the controller uses it (decision 4, docs/design.md):
the dashboard's REST endpoint when this cluster runs a dashboard, else the Serve controller's
update_deployment_replicas. Each case is its own small Ray cluster, run in a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(mode: str, port: int) -> dict:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/scripts/serve_scaler_paths.py"), mode, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # a timeout stops the script and its cluster together
    )
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("mode", "port", "path"),
    [
        ("dash", 18503, "REST http://"),
        ("nodash", 18504, "Serve controller update_deployment_replicas"),
    ],
)
def test_scale_up_and_to_zero_through_the_external_scaler(mode, port, path):
    result = _run(mode, port)
    assert result["path"].startswith(path), result
    assert result["counts"] == {"2": [2, 2], "0": [0, 0]}, result
