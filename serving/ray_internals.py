"""The one module that touches Ray's private modules (`ray._private`, `ray.serve._private`).

Each function below names what it reads and why no public API gives it on Ray 2.60. Product and
test code call these instead of importing private modules, so a Ray upgrade that moves one of
them breaks here, in one place, with a test (`tests/unit/repo/test_repository.py`) keeping it so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def serve_controller() -> Any:
    """The Serve controller actor. Its name and namespace are private constants; the actor is
    how a driver without a dashboard reaches `update_deployment_replicas`."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)


def serve_instance_details() -> dict[str, Any] | None:
    """The Serve controller's instance details, as the plain dict it sends (the shape of
    `ray.serve.schema.ServeInstanceDetails`); None when no Serve controller runs.

    `serve.status()` reads this same dict and then builds pydantic models from it, and in Ray
    2.60 building them cloudpickles every deployment's request router class by value: about
    27 ms of CPU per call in a process that has torch and transformers imported, against
    under 1 ms for the dict (measured with two one-deployment apps). The ingress reads replica
    counts every 2 s, so it reads the dict."""
    import ray

    try:
        controller = serve_controller()
    except ValueError:  # no actor of that name: Serve is not running
        return None
    return ray.get(controller.get_serve_instance_details.remote(), timeout=30)


def deployment_id(name: str, app_name: str) -> Any:
    """Serve's DeploymentID (private type, no public constructor) for one deployment of an app."""
    from ray.serve._private.common import DeploymentID

    return DeploymentID(name=name, app_name=app_name)


def router_kwargs(name: str, app_name: str) -> dict[str, Any]:
    """The constructor arguments of a RequestRouter outside Serve (unit tests build one by hand;
    Serve builds it from private types)."""
    from ray.serve._private.common import DeploymentHandleSource

    return {
        "deployment_id": deployment_id(name, app_name),
        "handle_source": DeploymentHandleSource.UNKNOWN,
    }


def pending_request(internal_request_id: str, args: list[Any] | None = None) -> Any:
    """A routing request as Serve queues it for a RequestRouter (unit tests of a router's
    matching; Serve builds them from private types)."""
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    metadata = RequestMetadata(
        request_id=internal_request_id, internal_request_id=internal_request_id
    )
    return PendingRequest(args=args or [], kwargs={}, metadata=metadata)


def auth_headers() -> dict[str, str]:
    """Ray 2.60 token auth: the header Ray's own state API sends ({} when auth is off)."""
    from ray._private.authentication.http_token_authentication import (
        get_auth_headers_if_auth_enabled,
    )

    return get_auth_headers_if_auth_enabled({})


def dashboard_address() -> str | None:
    """The address THIS cluster's dashboard published in the GCS, or None (no dashboard, or not
    connected). The node's configured default (127.0.0.1:8265) is set even without a dashboard,
    and on a shared machine it may be another cluster's, so only the published value counts."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(
            ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD
        )
    except Exception:  # not connected to a cluster
        return None
    if not raw:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def local_raylet_pid() -> int | None:
    """The raylet of the cluster this driver started (Ray's workers are its children), so
    measurements leave out other clusters on the same machine; None in any other driver."""
    try:
        import ray
        from ray._private import ray_constants

        node = ray._private.worker._global_node
        return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    except Exception:
        return None


def logs_dir() -> Path:
    """The session's log folder of the cluster this driver is connected to."""
    import ray

    return Path(ray._private.worker._global_node.get_logs_dir_path())


def metrics_export_port() -> int:
    """The port of this node's Prometheus endpoint (Ray's metrics agent)."""
    import ray

    return int(ray._private.worker.global_worker.node.metrics_export_port)
