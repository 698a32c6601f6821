"""ForecastPolicy: the forecast-driven cold pool as Ray Serve's application-level scaling policy.

Public API only (Ray 2.60: `autoscaling_policy` of an application in the Serve config, with
`policy_function` a class and `policy_kwargs` its constructor's arguments). cluster.yaml:

    applications:
      - name: tideserve
        import_path: serving.app:build_app
        args: &tideserve_args {...}                   # our section
        autoscaling_policy:
          policy_function: autoscaling.serve_policy:ForecastPolicy
          policy_kwargs: {app_args: *tideserve_args}  # a YAML alias: the same args, once

Serve builds the class in its controller (on every deploy, and again after the controller
restarts) and calls it on every control-loop iteration with one `AutoscalingContext` per
deployment that has an `autoscaling_config`; serving/app.py gives the ingress and the hot pool a
fixed one (min = max), so the policy sees the ingress's `IngressStats` (request count, the batch
lane's ask) and every model replica's `ReplicaStats` (queue signals for the emergency path), all
from `record_autoscaling_stats` (serving/llm/autoscaling_stats.py). It returns a target for the
cold deployment only; the hot pool stays the plan's size.

Why no actor for the forecast history: this code runs inside Serve's control loop and must never
wait on another process. The history is a small JSON file on the node of Serve's controller (the
head node), read when Serve builds the policy and written atomically on a change or every 30 s
(autoscaling/policy_runtime.py); a few milliseconds, and nothing more to keep alive. On a
cluster whose head node is replaced, point `controller.history_path` at persistent storage.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from autoscaling.live_tick import PoolView
from autoscaling.policy_runtime import PolicyRuntime
from autoscaling.signals import adapter_miss_s_per_request
from serving.config import AppConfig
from serving.llm.autoscaling_stats import IngressStats, ReplicaStats, config_crc

log = logging.getLogger("ray.serve")

# Replicas record their stats every metrics_interval_s (serving/app.py); a sample older than
# this is from a replica that is gone or stuck and must not pin an emergency forever.
REPORT_MAX_AGE_S = 10.0
_INGRESS_KEYS = tuple(IngressStats.__dataclass_fields__)
_REPLICA_KEYS = tuple(ReplicaStats.__dataclass_fields__)


def _latest(ctx: Any, keys: tuple[str, ...], now_s: float) -> dict[Any, tuple[float, dict]]:
    """Per replica: (sample time, {key: latest value}) of its fresh custom metrics."""
    raw = ctx.raw_metrics or {}
    out: dict[Any, tuple[float, dict]] = {}
    for key in keys:
        for replica, series in (raw.get(key) or {}).items():
            if not series:
                continue
            point = series[-1]
            if now_s - point.timestamp > REPORT_MAX_AGE_S:
                continue
            t, values = out.get(replica, (point.timestamp, {}))
            values[key] = point.value
            out[replica] = (max(t, point.timestamp), values)
    return out


def read_view(contexts_by_name: dict[str, Any], now_s: float) -> PoolView:
    """The PoolView of one iteration, from Serve's contexts keyed by deployment name."""
    ingress, ingress_t = None, None
    if "ingress" in contexts_by_name:
        reports = _latest(contexts_by_name["ingress"], _INGRESS_KEYS, now_s)
        if reports:  # one ingress replica; with several, the counts add up
            ingress_t = max(t for t, _ in reports.values())
            stats = [IngressStats.from_metrics(v) for _, v in reports.values()]
            ingress = IngressStats(
                num_requests=sum(s.num_requests for s in stats),
                num_refused=sum(s.num_refused for s in stats),
                offline_cold_replicas=max(s.offline_cold_replicas for s in stats),
                config_crc=stats[0].config_crc,
            )
    replicas = []
    for pool in ("hot", "cold"):
        if pool in contexts_by_name:
            found = _latest(contexts_by_name[pool], _REPLICA_KEYS, now_s)
            replicas += [ReplicaStats.from_metrics(v) for _, v in found.values()]
    hot, cold = contexts_by_name.get("hot"), contexts_by_name["cold"]
    return PoolView(
        ingress=ingress,
        ingress_sample_s=ingress_t,
        hot_running=0 if hot is None else int(hot.current_num_replicas),
        cold_running=int(cold.current_num_replicas),
        cold_target=int(cold.target_num_replicas),
        queue_depth=sum(r.num_waiting for r in replicas),
        queue_wait_s=max((r.queue_wait_p99_s for r in replicas), default=0.0),
        adapter_miss_s_per_request=adapter_miss_s_per_request(
            (r.window_requests, r.lora_load_s) for r in replicas
        ),
    )


class ForecastPolicy:
    """Serve calls `policy(contexts)` -> ({cold's DeploymentID: target}, {})."""

    def __init__(self, app_args: dict | None = None, history_path: str | None = None) -> None:
        cfg = AppConfig.from_args(app_args or {})
        if cfg.model.task != "generate":
            raise ValueError(
                f"ForecastPolicy scales the cold pool of an LLM app; model.task is "
                f"{cfg.model.task!r} (an embed app has no cold pool)"
            )
        self.runtime = PolicyRuntime(cfg, config_crc(cfg.to_dict()), history_path)
        self.failures = 0

    def __call__(self, contexts: dict[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        by_name = {ctx.deployment_name: ctx for ctx in contexts.values()}
        ids = {ctx.deployment_name: dep_id for dep_id, ctx in contexts.items()}
        if "cold" not in by_name:
            return {}, {}
        cold = by_name["cold"]
        now_s = cold.current_time if cold.current_time is not None else time.time()
        try:
            target = self.runtime.step(read_view(by_name, now_s), now_s)
        except Exception:  # never break Serve's control loop; hold the pool and say why
            self.failures += 1
            if self.failures <= 5 or self.failures % 100 == 0:
                log.exception("ForecastPolicy failed (%d times); cold pool held", self.failures)
            return {}, {}
        return ({} if target is None else {ids["cold"]: target}), {}
