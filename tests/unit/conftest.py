"""Unit tests run without Ray. A code path that reads Serve's state (the ingress's pool watch,
serving/ray_internals.py) would otherwise start a local Ray cluster inside the pytest process by
Ray's auto-init, and that cluster's later death ends the whole process with exit status 1 and
no report. Here such reads see "Serve is not running", as they do outside a cluster."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ray_cluster(monkeypatch):
    from serving import ray_internals

    def no_serve_controller():
        raise ValueError("unit tests run without Ray: no Serve controller")

    monkeypatch.setattr(ray_internals, "serve_controller", no_serve_controller)
