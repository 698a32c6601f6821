"""Reading Serve's own view of an application: replica counts per deployment, our app's name.

The one place that interprets `serve.status()`; the ingress (which pools have a running
replica) and the autoscaler (running vs starting replicas) both read it through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.config.app_config import DEFAULT_APP_NAME

# Replicas that exist or are on their way; RUNNING alone means ready (constructor finished).
_LIVE_STATES = ("STARTING", "UPDATING", "RECOVERING", "RUNNING", "PENDING_MIGRATION")


@dataclass(frozen=True, slots=True)
class DeploymentCounts:
    running: int  # ready: constructor (load + self-check) finished
    live: int  # running or on the way (starting, updating, recovering)


def read_counts(app_name: str) -> dict[str, DeploymentCounts] | None:
    """Replica counts per deployment of the app; None if Serve does not know the app."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return None
    counts = {}
    for name, dep in app.deployments.items():
        states = {str(getattr(s, "value", s)): n for s, n in dep.replica_states.items()}
        counts[name] = DeploymentCounts(
            running=states.get("RUNNING", 0),
            live=sum(n for s, n in states.items() if s in _LIVE_STATES),
        )
    return counts


def running_replicas(app_name: str) -> dict[str, int]:
    """Running (ready) replicas per deployment of the app; {} while Serve does not know it."""
    return {name: c.running for name, c in (read_counts(app_name) or {}).items()}


def app_name_or_default() -> str:
    """The Serve application this replica belongs to; the default name outside a replica."""
    from ray import serve

    try:
        return serve.get_replica_context().app_name
    except Exception:  # constructed outside a replica (unit tests)
        return DEFAULT_APP_NAME
