"""The controller's I/O with Ray Serve: read replica counts, apply target replica counts.

Only the controller actor (autoscaling/controller.py) calls this module. Targets go through Serve's
external scaling API (decision 4, docs/design.md), which Ray 2.60 accepts only for applications
deployed with `external_scaler_enabled: true` and no `autoscaling_config` on any deployment:

1. `POST /api/v1/applications/{app}/deployments/{dep}/scale` on the dashboard, the public path,
   used when the dashboard is up; the body is `{"target_num_replicas": N}`. With Ray 2.60's token
   auth the request carries the cluster token, read the way Ray's own state API reads it.
2. The Serve controller actor's `update_deployment_replicas(DeploymentID, N)`, the method that
   REST endpoint calls, used when no dashboard runs (`include_dashboard=False`, our tests).
Both refuse with a message naming `external_scaler_enabled` when the flag is off.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable

from serving.llm.autoscaling_stats import IngressStats
from serving.ray_internals import auth_headers, dashboard_address, deployment_id, serve_controller
from serving.serve_status import DeploymentCounts, read_counts

log = logging.getLogger("ray.serve")

__all__ = ["DeploymentCounts", "ServeScaler", "announce_target", "read_counts"]

REST_TIMEOUT_S = 10.0


def ingress_stats(app_name: str) -> IngressStats | None:
    """The ingress's cumulative request and refusal counts; None while it is unreachable
    (restarting): a missing window for the forecaster, not zero traffic."""
    from ray import serve

    try:
        handle = serve.get_deployment_handle("ingress", app_name)
        return handle.autoscaling_stats.remote().result(timeout_s=10)
    except Exception as err:
        log.warning("ingress counts unavailable: %s", err)
        return None


def announce_target(app_name: str, deployment: str, target: int) -> bool:
    """Tell the ingress a pool's new target before applying it, so it stops routing to a pool
    that is being emptied. False when it could not be told (the caller scales anyway: the
    ingress's own status poll catches up within ~2 s)."""
    from ray import serve

    try:
        handle = serve.get_deployment_handle("ingress", app_name)
        handle.set_pool_target.remote(deployment, target).result(timeout_s=10)
        return True
    except Exception as err:
        log.warning("could not announce %s -> %s to the ingress: %s", deployment, target, err)
        return False


def dashboard_url() -> str | None:
    """The http URL of THIS cluster's dashboard, or None when it runs none."""
    address = dashboard_address()
    if address is None:
        return None
    return address if address.startswith("http") else f"http://{address}"


class ServeScaler:
    """Applies targets over REST when this cluster's dashboard answers, else through the Serve
    controller actor. The REST endpoint is used only after one GET showed that the dashboard
    reports our Serve controller's actor id (several clusters may share a machine and a token)."""

    def __init__(self, app_name: str, find_dashboard: Callable[[], str | None]) -> None:
        self.app_name = app_name
        self._find_dashboard = find_dashboard
        self.dashboard: str | None = None
        self._looked = False  # looked up at the first scale: Serve may not run before that
        self.path_used = "none yet"

    def scale(self, deployment: str, target: int) -> None:
        if not self._looked:
            url = self._find_dashboard()
            self.dashboard = url if url and self._dashboard_is_ours(url) else None
            self._looked = True
        if self.dashboard is not None:
            try:
                self._scale_rest(deployment, target)
                self.path_used = f"REST {self.dashboard}"
                return
            except urllib.error.URLError as err:  # the dashboard went away: use the actor path
                log.warning(
                    "dashboard %s unreachable (%s); using the Serve controller",
                    self.dashboard,
                    err.reason,
                )
                self.dashboard = None
        self._scale_actor(deployment, target)
        self.path_used = "Serve controller update_deployment_replicas"

    @staticmethod
    def _dashboard_is_ours(url: str) -> bool:
        try:
            request = urllib.request.Request(
                f"{url}/api/serve/applications/", headers=auth_headers()
            )
            with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as resp:
                details = json.loads(resp.read())
            theirs = (details.get("controller_info") or {}).get("actor_id")
            return bool(theirs) and theirs == serve_controller()._actor_id.hex()
        except Exception as err:  # no dashboard, no Serve module in it, or another cluster
            log.info("not using the dashboard at %s for scaling: %s", url, err)
            return False

    def _scale_rest(self, deployment: str, target: int) -> None:
        url = f"{self.dashboard}/api/v1/applications/{self.app_name}/deployments/{deployment}/scale"
        headers = {"Content-Type": "application/json", **auth_headers()}
        body = json.dumps({"target_num_replicas": int(target)}).encode()
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=REST_TIMEOUT_S) as resp:
                resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise RuntimeError(f"POST {url} -> HTTP {err.code}: {detail}") from None

    def _scale_actor(self, deployment: str, target: int) -> None:
        import ray

        dep_id = deployment_id(deployment, self.app_name)
        ray.get(
            serve_controller().update_deployment_replicas.remote(dep_id, int(target)), timeout=30
        )
