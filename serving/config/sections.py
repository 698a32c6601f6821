"""The sections of the application config: one frozen, self-validating dataclass per YAML section.

The field defaults below are THE defaults; cluster.yaml only overrides them. Every class validates
itself in `__post_init__` and names errors by its YAML path (`replica.num_cpus=...`). Classes used
under several paths (TierConfig, LeadOverride) name themselves by class, and the builder in
serving/config/app_config.py rewrites that owner to the path it was read from.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from common import policy_defaults as policy
from common.tiers import TIERS
from common.validate import check_bool, check_choice, check_order, check_range

MODEL_TASKS = ("generate", "embed")  # embed: a single-pass model behind /v1/embeddings
TIER_NAMES = TIERS  # ("interactive", "analytical", "offline"), in serving order

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")
_MINUTES_PER_DAY = 24 * 60
# Ray takes CPUs and GPUs through num_cpus / num_gpus and refuses them inside `resources`.
_RESERVED_RESOURCES = ("CPU", "GPU")


def _check_seconds(owner: str, name: str, value: Any, *, allow_zero: bool = False) -> None:
    check_range(owner, name, value, 0.0, None, lo_open=not allow_zero)
    if not math.isfinite(value):  # a finite value keeps to_dict() plain JSON
        raise ValueError(f"{owner}.{name}={value!r} must be a finite number of seconds")


def _check_str(owner: str, name: str, value: Any, what: str = "a non-empty string") -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{owner}.{name}={value!r} must be {what}")


def _check_resources(owner: str, value: Any) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{owner}.resources={value!r} must be a mapping of custom Ray resource name to amount"
        )
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{owner}.resources key {name!r} must be a non-empty resource name")
        if name in _RESERVED_RESOURCES:
            raise ValueError(
                f"{owner}.resources.{name}={amount!r} is not allowed; "
                f"set replica.num_{name.lower()}s instead"
            )
        check_range(owner, f"resources.{name}", amount, 0.0, None)
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class TierConfig:
    """SLOs and queue bounds of one tier. Each tier's defaults live in DEFAULT_TIERS."""

    _owner: ClassVar[str] = "TierConfig"

    # Time-to-first-token SLO; a replica admits a request of the tier only if its predicted TTFT
    # fits ttft_p99_s x ttft_admit_fraction (serving/llm/admission.py).
    ttft_p99_s: float
    e2e_p99_s: float  # end-to-end latency SLO
    max_queue_wait_s: float  # a request waiting longer for admission fails with a timeout
    max_waiting: int  # requests of the tier waiting in one replica; beyond it the replica refuses
    # Gap between two tokens of one stream; the concurrency tuner keeps a step's time under it
    # (serving/engine/tuner.py). null: no inter-token target for this tier.
    itl_p99_s: float | None = None
    # The share of ttft_p99_s a predicted TTFT may use: the prediction is a typical value, the
    # SLO a p99 seen by the client, which also pays the HTTP front door and step-time noise
    # (R10: queue wait past half the latency budget means saturated).
    ttft_admit_fraction: float = 0.5

    def __post_init__(self) -> None:
        check_range(self._owner, "ttft_admit_fraction", self.ttft_admit_fraction, 0.0, 1.0,
                    lo_open=True)  # fmt: skip
        for name in ("ttft_p99_s", "e2e_p99_s", "max_queue_wait_s"):
            _check_seconds(self._owner, name, getattr(self, name))
        check_range(self._owner, "max_waiting", self.max_waiting, 0, None, integer=True)
        # The first token cannot be due after the last one.
        check_order(self._owner, ("ttft_p99_s", self.ttft_p99_s), ("e2e_p99_s", self.e2e_p99_s))
        if self.itl_p99_s is not None:
            _check_seconds(self._owner, "itl_p99_s", self.itl_p99_s)
            check_order(self._owner, ("itl_p99_s", self.itl_p99_s), ("e2e_p99_s", self.e2e_p99_s))


DEFAULT_TIERS: Mapping[str, TierConfig] = MappingProxyType(
    {
        "interactive": TierConfig(
            ttft_p99_s=1.0, e2e_p99_s=20.0, max_queue_wait_s=10.0, max_waiting=64, itl_p99_s=0.5
        ),
        "analytical": TierConfig(
            ttft_p99_s=10.0, e2e_p99_s=120.0, max_queue_wait_s=60.0, max_waiting=256, itl_p99_s=2.0
        ),
        "offline": TierConfig(
            ttft_p99_s=600.0,
            e2e_p99_s=3600.0,
            max_queue_wait_s=3600.0,
            max_waiting=1024,
            itl_p99_s=30.0,
        ),
    }
)


@dataclass(frozen=True, slots=True)
class HotPool:
    _owner: ClassVar[str] = "pools.hot"

    num_replicas: int = 1  # always up, never scaled to zero
    # Custom Ray resources each replica needs, e.g. {pool_hot: 1}, to pin the group to a node group.
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_range(self._owner, "num_replicas", self.num_replicas, 1, None, integer=True)
        object.__setattr__(self, "resources", _check_resources(self._owner, self.resources))

    def __reduce__(self):  # MappingProxyType does not pickle; rebuild through validation
        return (type(self), (self.num_replicas, dict(self.resources)))


@dataclass(frozen=True, slots=True)
class ColdPool:
    _owner: ClassVar[str] = "pools.cold"

    min_replicas: int = 0  # the forecast controller never goes below this
    max_replicas: int = 2  # ...nor above this
    initial_replicas: int = 1  # replicas at deploy time
    resources: Mapping[str, float] = field(default_factory=dict)  # e.g. {pool_cold: 1}

    def __post_init__(self) -> None:
        for name in ("min_replicas", "max_replicas", "initial_replicas"):
            check_range(self._owner, name, getattr(self, name), 0, None, integer=True)
        check_order(
            self._owner,
            ("min_replicas", self.min_replicas),
            ("initial_replicas", self.initial_replicas),
            ("max_replicas", self.max_replicas),
        )
        object.__setattr__(self, "resources", _check_resources(self._owner, self.resources))

    def __reduce__(self):
        args = (self.min_replicas, self.max_replicas, self.initial_replicas, dict(self.resources))
        return (type(self), args)


@dataclass(frozen=True, slots=True)
class PoolsConfig:
    hot: HotPool = field(default_factory=HotPool)
    cold: ColdPool = field(default_factory=ColdPool)


@dataclass(frozen=True, slots=True)
class ReplicaSection:
    """How each model replica runs; hot and cold replicas share it (R9)."""

    _owner: ClassVar[str] = "replica"

    num_cpus: float = 1.0  # Ray CPUs reserved per replica
    num_gpus: float = 0.0  # fractions share a GPU between replicas
    # torch threads per replica; `auto`: from the node's cores, pinned where the replica holds
    # the node (num_cpus >= its cores), one core left to the front door and Ray (docs/engine.md)
    torch_threads: int | str = "auto"
    max_ongoing_requests: int = 64  # Serve's in-flight limit per replica
    max_queued_requests: int = 128  # -1: no limit (Serve's convention)
    graceful_shutdown_timeout_s: float = 30.0  # a draining replica finishes in-flight work
    health_check_period_s: float = 10.0  # how often Serve calls check_health
    warmup_max_tokens: int = 4  # the self-check generation run before the replica is ready
    # After a stream's first token (sent at once), its tokens leave the replica as one message
    # per this many seconds: fewer Ray streaming hops, SSE frames and decodes per token (Ray Serve
    # LLM's stream_batching_interval_ms). 0 sends every engine step's tokens as they come.
    stream_interval_s: float = 0.1
    # Added to the niceness of each LLM replica process without a GPU (num_gpus 0). The HTTP
    # proxy and the ingress relay every token and answer every refusal; on shared cores they
    # otherwise wait behind the engines' compute, and that wait is TTFT no replica can see
    # (docs/serving.md#the-front-door-runs-first). 0 leaves Ray's niceness as it is.
    cpu_nice_increment: int = 4
    # A replica that just became ready takes a share of its routing rank rising from 10% to all
    # over this window (serving/llm/slow_start.py), not every request at once. 0 disables.
    slow_start_s: float = 10.0

    def __post_init__(self) -> None:
        o = self._owner
        check_range(o, "stream_interval_s", self.stream_interval_s, 0.0, 5.0)
        check_range(o, "slow_start_s", self.slow_start_s, 0.0, 3600.0)
        check_range(o, "cpu_nice_increment", self.cpu_nice_increment, 0, 19, integer=True)
        check_range(o, "num_cpus", self.num_cpus, 0.0, None)
        check_range(o, "num_gpus", self.num_gpus, 0.0, None)
        if self.torch_threads != "auto":
            if isinstance(self.torch_threads, str):
                raise ValueError(
                    f"{o}.torch_threads={self.torch_threads!r}: expected 'auto' or an integer >= 1"
                )
            check_range(o, "torch_threads", self.torch_threads, 1, None, integer=True)
        check_range(o, "max_ongoing_requests", self.max_ongoing_requests, 1, None, integer=True)
        check_range(o, "max_queued_requests", self.max_queued_requests, -1, None, integer=True)
        if self.max_queued_requests == 0:  # Serve refuses 0 too
            raise ValueError(f"{o}.max_queued_requests=0 is not allowed; use -1 (no limit) or >= 1")
        _check_seconds(o, "graceful_shutdown_timeout_s", self.graceful_shutdown_timeout_s)
        _check_seconds(o, "health_check_period_s", self.health_check_period_s)
        check_range(o, "warmup_max_tokens", self.warmup_max_tokens, 1, None, integer=True)


@dataclass(frozen=True, slots=True)
class ServerSection:
    _owner: ClassVar[str] = "server"

    api_key_env: str | None = None  # name of an environment variable holding the key; None: no auth
    max_body_bytes: int = 1048576  # larger request bodies: 413, checked while reading
    default_max_tokens: int = 256  # for requests that name no max_tokens
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    # Retry-After on 429/503 answers that have no prediction (a replica failed, a queue timeout);
    # a replica's refusal carries the predicted time until capacity frees instead.
    retry_after_s: float = 2.0
    # The cap on that predicted Retry-After, which is at least 1 s (serving/llm/admission.py).
    retry_after_max_s: float = 60.0
    # Streams the ingress relays at once; null: a batch running and one waiting per replica,
    # (hot + cold max) replicas x min(replica.max_ongoing_requests, 2 x engine.max_num_seqs);
    # analytical and offline requests hold at most half of them (serving/config/front_door.py).
    ingress_max_ongoing_requests: int | None = None
    # Requests that may wait in the HTTP proxy for the ingress; beyond them Serve answers 429
    # with Retry-After. null: what drains within the tightest tier's TTFT admission budget at
    # the replicas' capacity (controller.replica_capacity_rps each; serving/config/front_door.py).
    ingress_max_queued_requests: int | None = None
    # The tier of a request that names none, and of OpenAI's service_tier "auto" / "default".
    service_tier_default: str = "interactive"

    def __post_init__(self) -> None:
        o = self._owner
        check_choice(o, "service_tier_default", self.service_tier_default, TIERS[:2])
        if self.api_key_env is not None and not (
            isinstance(self.api_key_env, str) and _ENV_NAME.match(self.api_key_env)
        ):
            # Not echoed: a user who pasted the key itself here would see it in every log.
            raise ValueError(
                f"{o}.api_key_env=<value not shown> must be null or the NAME of an environment "
                "variable ([A-Za-z_][A-Za-z0-9_]*) that holds the key, not the key itself"
            )
        check_range(o, "max_body_bytes", self.max_body_bytes, 1, None, integer=True)
        check_range(o, "default_max_tokens", self.default_max_tokens, 1, None, integer=True)
        check_range(o, "max_tokens_limit", self.max_tokens_limit, 1, None, integer=True)
        check_order(
            o,
            ("default_max_tokens", self.default_max_tokens),
            ("max_tokens_limit", self.max_tokens_limit),
        )
        _check_seconds(o, "retry_after_s", self.retry_after_s)
        check_range(o, "retry_after_max_s", self.retry_after_max_s, 1.0, 3600.0)
        for name in ("ingress_max_ongoing_requests", "ingress_max_queued_requests"):
            if getattr(self, name) is not None:
                check_range(o, name, getattr(self, name), 1, None, integer=True)


def _minute_of_day(owner: str, name: str, value: Any) -> int:
    match = _HHMM.match(value) if isinstance(value, str) else None
    if match is None:
        # YAML 1.1 reads an unquoted 22:00 as the base-60 integer 1320.
        raise ValueError(
            f'{owner}.{name}={value!r} must be a quoted "HH:MM" string, 00:00 to 23:59'
        )
    return int(match[1]) * 60 + int(match[2])


@dataclass(frozen=True, slots=True)
class LeadOverride:
    """Use lead_s instead of forecast_lead_s from start to end (UTC, "HH:MM"; may wrap midnight)."""

    _owner: ClassVar[str] = "LeadOverride"

    start: str  # "HH:MM" UTC, quoted in YAML
    end: str  # "HH:MM" UTC, exclusive; may be earlier than start (wraps midnight)
    lead_s: float  # the forecast lead inside the window

    def __post_init__(self) -> None:
        start = _minute_of_day(self._owner, "start", self.start)
        end = _minute_of_day(self._owner, "end", self.end)
        if start == end:  # empty or the whole day: ambiguous either way
            raise ValueError(
                f"{self._owner}.end={self.end!r} must differ from start={self.start!r}"
            )
        _check_seconds(self._owner, "lead_s", self.lead_s)

    def minutes(self) -> frozenset[int]:
        """Minutes of the day covered, [start, end) with wrap-around."""
        start = _minute_of_day(self._owner, "start", self.start)
        length = (_minute_of_day(self._owner, "end", self.end) - start) % _MINUTES_PER_DAY
        return frozenset((start + i) % _MINUTES_PER_DAY for i in range(length))


SCALERS = ("serve_policy", "external")


@dataclass(frozen=True, slots=True)
class ControllerSection:
    """Read by the forecast-driven cold pool: Serve's autoscaling policy
    (autoscaling/serve_policy.py), or the controller actor (autoscaling/controller.py)."""

    _owner: ClassVar[str] = "controller"

    interval_s: float = 10.0  # seconds between two controller ticks
    # scale for the load forecast this far ahead when no cold start was measured
    forecast_lead_s: float = policy.LEAD_S
    # scale down only after this long below target
    stabilization_window_s: float = policy.STABILIZATION_WINDOW_S
    # extra lead for a cold replica to load and warm up
    cold_start_margin_s: float = policy.COLD_START_MARGIN_S
    # > 0: the margin, the horizon, the scale-down window and the emergency's drain were fit at a
    # cold start this long, and shrink in proportion when the measured p95 start is shorter
    # (cheaper with fast starts; docs/autoscaling.md, the fifteenth and sixteenth tuning runs);
    # 0 (the default): fixed
    protections_fit_at_cold_start_s: float = policy.PROTECTIONS_FIT_AT_COLD_START_S
    # Time-of-day windows with their own lead (e.g. the noon peak 20 min ahead); disjoint.
    lead_overrides: tuple[LeadOverride, ...] = ()
    # Requests/s one replica sustains within the TTFT SLO (e.g. `python -m capacity plan`'s
    # figure); the policy plans for replica_capacity_rps x target_utilization (R6 safety factor).
    replica_capacity_rps: float = 2.0
    # the share of replica_capacity_rps planned for
    target_utilization: float = policy.TARGET_UTILIZATION
    # capacity kept above the plan so that its Poisson arrivals pass half the TTFT SLO's wait
    # this share of the time (autoscaling/policy.queue_margin_rps); 0 turns the margin off
    queue_tail_share: float = policy.QUEUE_TAIL_SHARE
    # the scale-down band: a cold replica goes only if the pool left behind passes that wait at
    # most this share of the time (autoscaling/policy._scale_down_band); 0: no band, and at or
    # above queue_tail_share it keeps nothing the plan does not
    scale_down_tail_share: float = policy.SCALE_DOWN_TAIL_SHARE
    # A `controller:` section in cluster.yaml turns the forecast-driven cold pool on
    # (serving/config/app_config.py sets enabled unless the section says `enabled: false`).
    enabled: bool = False
    # Who applies the cold pool's targets. serve_policy: Ray Serve's application-level
    # autoscaling policy (autoscaling/serve_policy.py; the app's `autoscaling_policy` in the Serve
    # config names it). external: the detached actor of autoscaling/controller.py through Serve's
    # external scaler (deploy with `external_scaler_enabled: true`), kept as an option.
    scaler: str = "serve_policy"
    app_name: str = "tideserve"  # the Serve application it scales (cluster.yaml's `name`)
    # Its history (forecast, cold starts, decisions), so a restart keeps the forecast. Put it on
    # storage every node sees in a multi-node cluster. None: ~/.cache/tideserve/.
    history_path: str | None = None
    # Model seconds per real second; > 1 plays a compressed day (tests, demos). Rates stay real.
    time_scale: float = 1.0
    clock_start_s: float | None = None  # model time (epoch s) at start; None: the wall clock

    def __post_init__(self) -> None:
        o = self._owner
        for name in ("interval_s", "forecast_lead_s", "stabilization_window_s", "time_scale"):
            _check_seconds(o, name, getattr(self, name))
        check_bool(o, "enabled", self.enabled)
        check_choice(o, "scaler", self.scaler, SCALERS)
        _check_str(o, "app_name", self.app_name)
        if self.history_path is not None:
            _check_str(o, "history_path", self.history_path, "null or a file path")
        if self.clock_start_s is not None:
            _check_seconds(o, "clock_start_s", self.clock_start_s, allow_zero=True)
        check_range(o, "replica_capacity_rps", self.replica_capacity_rps, 0.0, 1e9, lo_open=True)
        check_range(o, "target_utilization", self.target_utilization, 0.0, 1.0, lo_open=True)
        check_range(o, "queue_tail_share", self.queue_tail_share, 0.0, 0.5)
        check_range(o, "scale_down_tail_share", self.scale_down_tail_share, 0.0, 0.5)
        _check_seconds(o, "cold_start_margin_s", self.cold_start_margin_s, allow_zero=True)
        _check_seconds(
            o,
            "protections_fit_at_cold_start_s",
            self.protections_fit_at_cold_start_s,
            allow_zero=True,
        )
        overrides = self.lead_overrides
        if not isinstance(overrides, list | tuple) or not all(
            isinstance(x, LeadOverride) for x in overrides
        ):
            raise ValueError(f"{o}.lead_overrides={overrides!r} must be a list of LeadOverride")
        object.__setattr__(self, "lead_overrides", tuple(overrides))
        covered = [x.minutes() for x in overrides]
        for i, j in itertools.combinations(range(len(covered)), 2):
            if covered[i] & covered[j]:
                a, b = overrides[i], overrides[j]
                raise ValueError(
                    f"{o}.lead_overrides[{i}] ({a.start}-{a.end}) overlaps "
                    f"{o}.lead_overrides[{j}] ({b.start}-{b.end}); windows must be disjoint"
                )

    def lead_s_at(self, minute_of_day: int) -> float:
        """The forecast lead in force at this UTC minute of the day."""
        for override in self.lead_overrides:
            if minute_of_day % _MINUTES_PER_DAY in override.minutes():
                return override.lead_s
        return self.forecast_lead_s
