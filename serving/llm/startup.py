"""A replica's start-up, phase by phase: what a scale-up waits for before the replica serves.

The autoscaler pays a cold start on every scale-up (R9's forecast lead must cover it), so the
replica times each phase of its constructor and reports them in ReplicaInfo and as the gauge
`tideserve_replica_startup_seconds{phase}`. What happens before the constructor (Ray placing
the actor, starting or reusing a worker process, importing this package) is measured from
outside by benchmarks/cold_start.py as deploy-to-ready minus the constructor's total.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

PHASES: tuple[str, ...] = ("setup", "resolve", "load", "self_check", "warm")


@dataclass(frozen=True, slots=True)
class StartupPhases:
    """Seconds per constructor phase, in order.

    setup: config validation, core layout and pinning; resolve: the model directory (the
    embedded model's safetensors cache is written here on a node's first start); load: weights,
    tokenizer and the KV cache allocation; self_check: the warm-up generation (R10); warm: the
    grammar compiler's vocabulary table.
    """

    setup_s: float = 0.0
    resolve_s: float = 0.0
    load_s: float = 0.0
    self_check_s: float = 0.0
    warm_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, float]:
        return {f.name.removesuffix("_s"): getattr(self, f.name) for f in fields(self)}


class StartupClock:
    """Marks the end of each phase in order; `phases()` returns the typed result."""

    def __init__(self, now_s: float | None = None) -> None:
        self._last_s = time.monotonic() if now_s is None else now_s
        self._spent_s: dict[str, float] = {}

    def mark(self, phase: str, now_s: float | None = None) -> None:
        """End `phase` now (or at `now_s`); phases must come in PHASES order, each once."""
        if phase not in PHASES:
            raise ValueError(f"phase={phase!r} is not one of {list(PHASES)}")
        expected = PHASES[len(self._spent_s)] if len(self._spent_s) < len(PHASES) else None
        if phase != expected:
            raise ValueError(f"phase={phase!r} out of order: expected {expected!r}")
        now_s = time.monotonic() if now_s is None else now_s
        self._spent_s[phase] = max(0.0, now_s - self._last_s)
        self._last_s = now_s

    def phases(self) -> StartupPhases:
        return StartupPhases(**{f"{name}_s": s for name, s in self._spent_s.items()})
