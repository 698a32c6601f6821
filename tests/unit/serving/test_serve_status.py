"""Replica counts from the Serve controller's details dict (serving/serve_status.py), no Ray."""

from __future__ import annotations

import enum

from serving import serve_status
from serving.serve_status import DeploymentCounts, counts_of, read_counts


class ReplicaState(enum.Enum):  # the controller's dict carries Ray's enum, not its value
    RUNNING = "RUNNING"
    STARTING = "STARTING"
    STOPPING = "STOPPING"


def test_running_means_ready_and_live_counts_the_replicas_on_their_way_too():
    replicas = [
        {"state": ReplicaState.RUNNING},
        {"state": ReplicaState.STARTING},
        {"state": ReplicaState.STOPPING},  # going away: neither running nor live
        {"state": "RUNNING"},  # a plain value reads the same
    ]
    assert counts_of(replicas) == DeploymentCounts(running=2, live=3)
    assert counts_of([]) == DeploymentCounts(running=0, live=0)


def test_an_app_serve_does_not_know_and_serve_not_running_both_read_as_none(monkeypatch):
    details = {
        "applications": {
            "tideserve": {
                "deployments": {
                    "hot": {"replicas": [{"state": ReplicaState.RUNNING}]},
                    "cold": {"replicas": []},
                }
            }
        }
    }
    monkeypatch.setattr(serve_status, "serve_instance_details", lambda: details)
    assert read_counts("tideserve") == {
        "hot": DeploymentCounts(running=1, live=1),
        "cold": DeploymentCounts(running=0, live=0),
    }
    assert read_counts("other") is None
    monkeypatch.setattr(serve_status, "serve_instance_details", lambda: None)
    assert read_counts("tideserve") is None
    assert serve_status.running_replicas("tideserve") == {}
