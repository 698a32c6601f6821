"""Replica side of the controller's stats: push this replica's queue numbers to the controller.

A model replica calls `ControllerReporter.report(ReplicaReport)` from `record_routing_stats`,
which Serve calls on every replica every `request_routing_stats_period_s` (2 s) whether or not
traffic flows.
Pushing beats pulling here: a DeploymentHandle reaches one replica at random, while every replica
knows its own app and pool and can name the controller actor. The call is fire-and-forget, so a
slow or absent controller never slows the replica; without a controller (no `controller:`
section) the lookup fails and is retried only every `LOOKUP_EVERY_CALLS` calls.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.llm.messages import ReplicaReport

log = logging.getLogger("ray.serve")

CONTROLLER_NAMESPACE = "tideserve"
LOOKUP_EVERY_CALLS = 15  # about 30 s at Serve's 2 s routing-stats period


def controller_name(app_name: str) -> str:
    """The detached controller actor of one Serve application."""
    return f"tideserve-autoscaler:{app_name}"


class ControllerReporter:
    def __init__(self, app_name: str, pool: str, replica_id: str) -> None:
        self.app_name = app_name
        self.pool = pool
        self.replica_id = replica_id
        self._handle: Any = None
        self._calls_until_lookup = 0

    def _lookup(self) -> Any:
        if self._handle is None:
            if self._calls_until_lookup > 0:
                self._calls_until_lookup -= 1
                return None
            self._calls_until_lookup = LOOKUP_EVERY_CALLS
            import ray

            try:
                self._handle = ray.get_actor(
                    controller_name(self.app_name), namespace=CONTROLLER_NAMESPACE
                )
            except ValueError:  # no controller for this app (yet)
                return None
        return self._handle

    def report(self, report: ReplicaReport) -> None:
        handle = self._lookup()
        if handle is None:
            return
        try:
            handle.report.remote(report)  # fire-and-forget: the result is never awaited
        except Exception as err:  # the actor was killed for good: look it up again later
            log.debug("controller report failed: %s", err)
            self._handle = None
