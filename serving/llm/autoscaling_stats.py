"""What the ingress and the model replicas tell Serve's autoscaler (`record_autoscaling_stats`).

    ingress  ──IngressStats──▶ Serve controller ──▶ autoscaling/serve_policy.py (rate, batch ask)
    replica  ──ReplicaStats──▶ Serve controller ──▶ autoscaling/serve_policy.py (queue signals)

Serve carries these as `Dict[str, float]` (its custom-metrics channel); the dict is built and
read here, from one frozen dataclass each, so both ends agree on the keys. A missing key reads
as the field's default (a replica of an older version), never as a KeyError in Serve's loop.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, fields
from typing import Any, TypeVar

S = TypeVar("S", bound="MetricsMessage")


class MetricsMessage:
    """Both messages' one encoding: each field a float under its own name; an int field is read
    back as an int, a missing key as the field's default. For frozen dataclasses only."""

    __slots__ = ()  # keeps the subclasses' dataclass slots

    def to_metrics(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_metrics(cls: type[S], metrics: dict[str, float]) -> S:
        values: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in metrics:
                raw = metrics[f.name]
                values[f.name] = int(raw) if f.type in ("int", int) else float(raw)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class IngressStats(MetricsMessage):
    num_requests: int = 0  # cumulative requests since the ingress started (a rate by difference)
    # cold replicas the batch lane asks for now (OfflineLane.cold_replicas_wanted)
    offline_cold_replicas: int = 0
    # crc32 of the app config the ingress was built from: the policy checks that its own copy
    # (policy_kwargs.app_args) is the same config, and holds the pool when it is not
    config_crc: int = 0
    # of num_requests, interactive and analytical ones refused for capacity (429): the replicas'
    # admission sheds what would miss the SLO, so under overload this, not the queue, grows
    num_refused: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaStats(MetricsMessage):
    num_waiting: int = 0  # sequences waiting for admission
    num_running: int = 0
    queue_wait_p99_s: float = 0.0  # over the replica's recent admissions
    kv_use_fraction: float = 0.0
    # over the replica's last closed step window (serving/llm/monitor.py): requests that got
    # their first token, and the engine seconds LoRA slot loads took; the policy derates
    # capacity by the loads' seconds per request
    window_requests: int = 0
    lora_load_s: float = 0.0


def config_crc(app_config_dict: dict[str, Any]) -> int:
    """A 31-bit checksum of an app config's canonical JSON (fits Serve's float metric exactly)."""
    canonical = json.dumps(app_config_dict, sort_keys=True, separators=(",", ":"))
    return zlib.crc32(canonical.encode()) & 0x7FFFFFFF
