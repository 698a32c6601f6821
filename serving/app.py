"""The composition root: `serve run cluster.yaml` or `serve run serving.app:app`.

Hot and cold are two deployments of ONE class bound to ONE config dict (decision 3,
docs/design.md), so the cold group cannot drift from the hot one; the ingress also checks their
fingerprints (R9).
An embedding app (`model.task: embed`) is one batching deployment instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from ray import serve
from ray.serve.config import BackpressureConfig, RequestRouterConfig

from serving.config import AppConfig
from serving.config.front_door import front_door
from serving.llm.autoscaling_stats import config_crc

ROUTER = "serving.llm.router:KVHeadroomRouter"
# With prefix caching on, a prompt goes where its prefix is probably cached (decision 9); with
# LoRA slots, an adapter's requests go where it is loaded (serving/llm/adapter_affinity.py).
PREFIX_ROUTER = "serving.llm.router:PrefixAffinityRouter"
# Deployment name -> environment variables for its replicas (what an operator sets with a
# runtime_env; the fault tests use it to break one pool only).
RuntimeEnvs = Mapping[str, Mapping[str, str]]


def _deployment_options(cfg: AppConfig, name: str, num_replicas: int, resources: dict) -> dict:
    """Serve options every replica deployment takes from the `replica` section (LLM and embed)."""
    rep = cfg.replica
    return dict(
        name=name,
        num_replicas=num_replicas,
        max_ongoing_requests=rep.max_ongoing_requests,
        max_queued_requests=rep.max_queued_requests,
        graceful_shutdown_timeout_s=rep.graceful_shutdown_timeout_s,
        health_check_period_s=rep.health_check_period_s,
        ray_actor_options={
            "num_cpus": rep.num_cpus,
            "num_gpus": rep.num_gpus,
            "resources": dict(resources),
        },
    )


def _affine(cfg: AppConfig) -> bool:
    return cfg.engine.prefix_caching or cfg.engine.max_loras > 0


def _replica_options(cfg: AppConfig, pool: str, num_replicas: int, resources: dict) -> dict:
    return {
        **_deployment_options(cfg, pool, num_replicas, resources),
        "request_router_config": RequestRouterConfig(
            request_router_class=PREFIX_ROUTER if _affine(cfg) else ROUTER,
            request_routing_stats_period_s=2.0,
        ),
    }


# Serve runs an application-level autoscaling policy (autoscaling/serve_policy.py) over the
# deployments that have an autoscaling_config, and feeds it their `record_autoscaling_stats`:
# the ingress and the hot pool get a fixed range (min = max) so the policy sees them too.
_STATS_PERIOD = {"metrics_interval_s": 1.0, "look_back_period_s": 10.0}


def _serve_policy(cfg: AppConfig) -> bool:
    return cfg.controller.enabled and cfg.controller.scaler == "serve_policy"


def _fixed_size(options: dict, num_replicas: int) -> dict:
    options = dict(options)
    del options["num_replicas"]
    n = num_replicas
    options["autoscaling_config"] = {
        "min_replicas": n, "max_replicas": n, "initial_replicas": n, **_STATS_PERIOD,
    }  # fmt: skip
    return options


def _cold_options(cfg: AppConfig) -> dict:
    cold = cfg.pools.cold
    options = _replica_options(cfg, "cold", cold.initial_replicas, cold.resources)
    if cfg.controller.enabled and cfg.controller.scaler == "external":
        # Serve's external scaler (our controller actor) forbids autoscaling_config on every
        # deployment of the app and Serve refuses num_replicas=0, so an empty cold pool starts
        # at 1 and the controller's first tick sets it to the forecast's target.
        options["num_replicas"] = max(cold.initial_replicas, 1)
    elif _serve_policy(cfg):
        # The forecast policy decides alone: Serve's delays and factors would add their own
        # hysteresis on top of its stabilisation window, so they are zero / one.
        del options["num_replicas"]
        options["autoscaling_config"] = {
            "min_replicas": cold.min_replicas,
            "max_replicas": max(cold.max_replicas, 1),
            "initial_replicas": cold.initial_replicas,
            "upscale_delay_s": 0.0,
            "downscale_delay_s": 0.0,
            "downscale_to_zero_delay_s": 0.0,
            **_STATS_PERIOD,
        }
    elif cold.initial_replicas == 0:
        # Serve refuses a fixed num_replicas of 0; an autoscaling range starting at 0 expresses
        # "no cold replica yet". The ingress sends nothing to an empty pool, so Serve's reactive
        # autoscaler sees no load and leaves it at 0.
        del options["num_replicas"]
        options["autoscaling_config"] = {
            "min_replicas": 0,
            "initial_replicas": 0,
            "max_replicas": max(cold.max_replicas, 1),
        }
    return options


def _ingress_options(cfg: AppConfig) -> dict:
    door = front_door(cfg)  # bounds derived from the pools, capacity and TTFT SLOs
    return dict(
        name="ingress",
        num_replicas=1,
        # On the head node: with num_cpus 0 it could land on a cold node, and the autoscaler
        # releasing that node after the peak would take the ingress with it.
        ray_actor_options={"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}},
        max_ongoing_requests=door.max_ongoing_requests,
        # Past the queue, Serve's proxy answers 429 + Retry-After before the request waits.
        max_queued_requests=door.max_queued_requests,
        backpressure_config=BackpressureConfig(status_code=429, retry_after_s=door.retry_after_s),
    )


def _with_env(options: dict, envs: RuntimeEnvs) -> dict:
    env = envs.get(options["name"])
    if not env:
        return options
    actor = {**options.get("ray_actor_options", {}), "runtime_env": {"env_vars": dict(env)}}
    return {**options, "ray_actor_options": actor}


def _build_embed_app(cfg: AppConfig, envs: RuntimeEnvs):
    """The deployment graph of an embedding app: `pools.hot.num_replicas` EmbedReplicas."""
    from serving.embed.replica import EmbedReplica

    hot = cfg.pools.hot
    options = _deployment_options(cfg, "embed", hot.num_replicas, hot.resources)
    # The batch loop bounds its own queue (dynamic_batching.max_queue -> 429); Serve must let enough
    # requests through for batches to form at all (its default of 5 would cap a batch at 5).
    options["max_ongoing_requests"] = max(
        cfg.replica.max_ongoing_requests, cfg.dynamic_batching.max_queue
    )
    return serve.deployment(EmbedReplica).options(**_with_env(options, envs)).bind(cfg.to_dict())


def build_graph(cfg: AppConfig, envs: RuntimeEnvs | None = None):
    """The deployment graph of a validated config; `envs` adds environment variables per
    deployment (hot, cold, ingress, embed)."""
    from serving.llm.replica import ModelReplica
    from serving.routes.ingress import HttpIngress

    envs = envs or {}
    if cfg.model.task == "embed":  # a single-pass model: one batching deployment, no pools
        return _build_embed_app(cfg, envs)
    shared = cfg.replica_args()  # the one config both groups (and the ingress) are built from
    replica = serve.deployment(ModelReplica)
    hot_options = _replica_options(cfg, "hot", cfg.pools.hot.num_replicas, cfg.pools.hot.resources)
    ingress_options = _ingress_options(cfg)
    if _serve_policy(cfg):  # hot stays the plan's size; the policy sees it and the ingress
        hot_options = _fixed_size(hot_options, cfg.pools.hot.num_replicas)
        ingress_options = _fixed_size(ingress_options, 1)
    hot = replica.options(**_with_env(hot_options, envs)).bind(shared, "hot")
    cold = replica.options(**_with_env(_cold_options(cfg), envs)).bind(shared, "cold")
    if cfg.controller.enabled and cfg.controller.scaler == "external":
        from autoscaling.controller import ensure_controller

        ensure_controller(cfg)
    ingress = serve.deployment(HttpIngress).options(**_with_env(ingress_options, envs))
    # The offline lane reads the batch_api section and the replica capacity the controller plans
    # with.
    lane = {"batch_api": cfg.to_dict()["batch_api"], "controller": {"enabled": False}}
    lane["controller"]["replica_capacity_rps"] = cfg.controller.replica_capacity_rps
    # The policy checks that its copy of the config (policy_kwargs) is the one built here.
    return ingress.bind(shared, hot, cold, lane, config_crc(cfg.to_dict()))


def build_app(args: dict | None = None):
    """Build the application from our section of cluster.yaml (validated strictly)."""
    return build_graph(AppConfig.from_args(args))


app = build_app()
