"""AppConfig: the application `args` of cluster.yaml, validated strictly into one frozen object.

Ray Serve validates the top of cluster.yaml but passes `args` through untouched and would ignore a
misspelled key there; this module rejects unknown keys, wrong types and out-of-range values with a
ValueError naming the full key path (`engine.max_num_seqz`), the value and what is allowed.
Sections and their defaults live in serving/config/sections.py; the engine section is EngineConfig.
"""

from __future__ import annotations

import hashlib
import json
import os
import reprlib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from types import MappingProxyType
from typing import Any

import yaml

from common.validate import check_keys
from serving.config.batch_api import BatchApiSection
from serving.config.dynamic_batching import DynamicBatchingSection
from serving.config.model import ModelSection
from serving.config.sections import (
    DEFAULT_TIERS,
    TIER_NAMES,
    ColdPool,
    ControllerSection,
    HotPool,
    LeadOverride,
    PoolsConfig,
    ReplicaSection,
    ServerSection,
    TierConfig,
)
from serving.engine.config import EngineConfig

DEFAULT_APP_NAME = "tideserve"
# The sections whose values every model replica must share: R9, cold replicas run the same
# configuration as hot ones, so both groups are built from one object and carry its fingerprint.
# Tiers and server count too: a replica admits or refuses by them (serving/llm/admission.py).
REPLICA_SECTIONS = ("model", "engine", "replica", "tiers", "server", "dynamic_batching")
# Keys renamed so that no two features share a name: an old key is an error naming the new one,
# never silently dropped (a `batch:` section meant for the Batch API would otherwise vanish).
RENAMED_KEYS = {
    "batch": "batch_api (the Batch API: /v1/files and /v1/batches)",
    "batching": "dynamic_batching (the embedding replicas' request batcher)",
}

__all__ = [
    "DEFAULT_APP_NAME",
    "AppConfig",
    "ColdPool",
    "ControllerSection",
    "HotPool",
    "LeadOverride",
    "ModelSection",
    "PoolsConfig",
    "ReplicaSection",
    "ServerSection",
    "TierConfig",
    "load_cluster_yaml",
]


@dataclass(frozen=True, slots=True)
class AppConfig:
    """Everything under `args:`; build with from_args / load_cluster_yaml, not field by field."""

    model: ModelSection = field(default_factory=ModelSection)
    engine: EngineConfig = field(default_factory=EngineConfig)
    tiers: Mapping[str, TierConfig] = field(default_factory=lambda: DEFAULT_TIERS)
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    replica: ReplicaSection = field(default_factory=ReplicaSection)
    server: ServerSection = field(default_factory=ServerSection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    # Dynamic batching of an embedding app (model.task: embed); None for generate apps.
    dynamic_batching: DynamicBatchingSection | None = None
    # The Batch API: /v1/files and /v1/batches, run by the offline lane (serving/batch/); read
    # by the ingress only.
    batch_api: BatchApiSection = field(default_factory=BatchApiSection)

    def __post_init__(self) -> None:
        if not isinstance(self.tiers, Mapping) or tuple(sorted(self.tiers)) != tuple(
            sorted(TIER_NAMES)
        ):
            raise ValueError(f"tiers={self.tiers!r} must map exactly {list(TIER_NAMES)}")
        tiers = {name: self.tiers[name] for name in TIER_NAMES}  # canonical order
        object.__setattr__(self, "tiers", MappingProxyType(tiers))
        if self.model.adapters and self.engine.max_loras < 1:
            raise ValueError(
                f"model.adapters names {len(self.model.adapters)} adapter(s) but "
                f"engine.max_loras={self.engine.max_loras}: set engine.max_loras >= 1 (LoRA slots "
                "per replica) to serve them"
            )

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | None) -> AppConfig:
        """Validate the application `args` (None or {}: all defaults)."""
        data = _mapping("args", args)
        _refuse_renamed(data)
        check_keys("", data, [f.name for f in fields(cls)])
        model = _build(ModelSection, "model", data.get("model"))
        if model.task == "embed":
            _refuse_llm_sections(data)
        return cls(
            model=model,
            engine=_build(EngineConfig, "engine", data.get("engine")),
            tiers=_build_tiers(data.get("tiers")),
            pools=_build_pools(data.get("pools")),
            replica=_build(ReplicaSection, "replica", data.get("replica")),
            server=_build(ServerSection, "server", data.get("server")),
            controller=_build_controller(data.get("controller")),
            dynamic_batching=_build_dynamic_batching(model.task, data.get("dynamic_batching")),
            batch_api=_build(BatchApiSection, "batch_api", data.get("batch_api")),
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict with every value spelled out; from_args(to_dict()) == self.
        An embed app's dict leaves out the sections only an LLM app reads."""
        plain = _plain(self)
        if self.model.task == "embed":
            for name in _LLM_ONLY_SECTIONS:
                del plain[name]
            del plain["pools"]["cold"]
        return plain

    def replica_args(self) -> dict[str, Any]:
        """The sections every replica (and the ingress) is built from, and nothing else.

        Pool sizes and controller settings stay out, so resizing a pool changes only the
        deployment's num_replicas: Serve then adds or drains replicas instead of restarting all.
        """
        plain = self.to_dict()
        return {name: plain[name] for name in REPLICA_SECTIONS}

    def replica_fingerprint(self) -> str:
        """sha256 of the canonical JSON of the sections hot and cold replicas must share (R9)."""
        canonical = json.dumps(self.replica_args(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def __reduce__(self):  # pickled through its dict: MappingProxyType does not pickle
        return (_from_dict, (self.to_dict(),))


def _from_dict(data: dict[str, Any]) -> AppConfig:
    return AppConfig.from_args(data)


def load_cluster_yaml(path: str | os.PathLike, app_name: str = DEFAULT_APP_NAME) -> AppConfig:
    """Read a Ray Serve config file and validate the `args` of the application `app_name`."""
    with open(path, encoding="utf-8") as f:  # a missing file raises FileNotFoundError naming it
        doc = yaml.safe_load(f)
    apps = doc.get("applications") if isinstance(doc, Mapping) else None
    if not isinstance(apps, list):
        raise ValueError(f"{os.fspath(path)}: not a Ray Serve config file (no 'applications' list)")
    for app in apps:
        if isinstance(app, Mapping) and app.get("name") == app_name:
            try:
                return AppConfig.from_args(app.get("args"))
            except ValueError as err:
                raise ValueError(f"{os.fspath(path)}: application {app_name!r}: {err}") from None
    names = [app.get("name") for app in apps if isinstance(app, Mapping)]
    raise ValueError(f"{os.fspath(path)}: no application named {app_name!r}; found {names}")


def _mapping(path: str, value: Any) -> dict[str, Any]:
    # An empty YAML section (`engine:` with nothing under it) reads as None: all defaults.
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}={reprlib.repr(value)} must be a mapping of keys to values")
    return dict(value)


def _is_float_field(f) -> bool:
    # Annotations are strings under `from __future__ import annotations`, types otherwise.
    return f.type is float or str(f.type).replace(" ", "") in ("float", "float|None")


def _coerce_floats(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # YAML `num_cpus: 1` is an int; store 1.0 so equal configs serialise (and fingerprint) alike.
    floats = {f.name for f in fields(cls) if _is_float_field(f)}
    return {
        k: float(v) if k in floats and type(v) is int else v  # bool is not int here
        for k, v in data.items()
    }


def _build(cls: type, path: str, value: Any, base: Any = None) -> Any:
    """One section: known keys only, ints widened to floats, the class validates the rest."""
    data = _mapping(path, value)
    check_keys(path, data, [f.name for f in fields(cls)])
    data = _coerce_floats(cls, data)
    if base is None:
        for f in fields(cls):
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{path}.{f.name} is required")
    owner = getattr(cls, "_owner", cls.__name__)
    try:
        return replace(base, **data) if base is not None else cls(**data)
    except (TypeError, ValueError) as err:
        message = str(err).replace(f"{owner}.", f"{path}.")
        if path not in message:
            message = f"{path}: {message}"
        raise ValueError(message) from None


def _build_tiers(value: Any) -> dict[str, TierConfig]:
    data = _mapping("tiers", value)
    check_keys("tiers", data, TIER_NAMES)
    # A tier named in YAML overrides only the fields it lists; the rest keep that tier's defaults.
    return {
        name: _build(TierConfig, f"tiers.{name}", data.get(name), base=DEFAULT_TIERS[name])
        for name in TIER_NAMES
    }


def _build_pools(value: Any) -> PoolsConfig:
    data = _mapping("pools", value)
    check_keys("pools", data, [f.name for f in fields(PoolsConfig)])
    return PoolsConfig(
        hot=_build(HotPool, "pools.hot", data.get("hot")),
        cold=_build(ColdPool, "pools.cold", data.get("cold")),
    )


# Sections only an LLM app reads: an embed app refuses them, as an LLM app refuses
# `dynamic_batching`, so a config written for one kind of app never half-applies to the other.
_LLM_ONLY_SECTIONS = ("engine", "tiers", "controller", "batch_api")


def _refuse_llm_sections(data: Mapping[str, Any]) -> None:
    for name in _LLM_ONLY_SECTIONS:
        if name in data:
            raise ValueError(
                f"{name}={reprlib.repr(data[name])} applies only to model.task: generate "
                "(model.task is 'embed')"
            )
    pools = data.get("pools")
    if isinstance(pools, Mapping) and "cold" in pools:
        raise ValueError(
            f"pools.cold={reprlib.repr(pools['cold'])} applies only to model.task: generate "
            "(an embed app has one replica group, pools.hot)"
        )


def _refuse_renamed(data: Mapping[str, Any]) -> None:
    for old, new in RENAMED_KEYS.items():
        if old in data:
            raise ValueError(f"{old}: is no longer a key; it was renamed {new}")


def _build_dynamic_batching(task: str, value: Any) -> DynamicBatchingSection | None:
    if task == "embed":
        return _build(DynamicBatchingSection, "dynamic_batching", value)
    if value is not None:  # silently ignoring it would hide a forgotten `task: embed`
        raise ValueError(
            f"dynamic_batching={reprlib.repr(value)} applies only to model.task: embed "
            f"(model.task is {task!r})"
        )
    return None


def _build_controller(value: Any) -> ControllerSection:
    data = _mapping("controller", value)
    if value is not None:  # a `controller:` section present turns the controller on
        data.setdefault("enabled", True)
    path = "controller.lead_overrides"
    raw = data.get("lead_overrides")
    if raw is None:
        data.pop("lead_overrides", None)
    elif not isinstance(raw, list | tuple):
        raise ValueError(
            f'{path}={raw!r} must be a list of {{start: "HH:MM", end: "HH:MM", lead_s: seconds}}'
        )
    else:
        data["lead_overrides"] = tuple(
            _build(LeadOverride, f"{path}[{i}]", item) for i, item in enumerate(raw)
        )
    return _build(ControllerSection, "controller", data)


def _plain(value: Any) -> Any:
    """Dataclasses, mappings and tuples down to dicts, lists and scalars; float fields as floats."""
    if is_dataclass(value) and not isinstance(value, type):
        values = {f.name: getattr(value, f.name) for f in fields(value)}
        return {k: _plain(v) for k, v in _coerce_floats(type(value), values).items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
