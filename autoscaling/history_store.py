"""The controller's memory across restarts: forecaster state, cold-start samples, last decisions.

One JSON file, written atomically (a temporary file in the same directory, fsync, os.replace), so a
crash mid-write leaves the previous version intact and a restarted controller keeps its forecast.
A file of another format version or that is not valid JSON is a ValueError naming the path; the
controller then starts fresh and says so rather than guessing.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1
MAX_DECISIONS = 50  # the last decisions kept for `status` and post-mortems


@dataclass(slots=True)
class History:
    forecaster: dict[str, Any] | None = None  # Forecaster.to_dict()
    headroom: dict[str, Any] | None = None  # HeadroomLearner.to_dict(): the forecast's errors
    cold_start_samples_s: list[float] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # newest last
    policy_state: dict[str, Any] | None = None  # PolicyState.to_dict(): stabilisation window
    saved_at_s: float | None = None  # controller (model) time of the save

    def add_decision(self, decision: dict[str, Any]) -> None:
        self.decisions.append(decision)
        del self.decisions[:-MAX_DECISIONS]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "forecaster": self.forecaster,
            "headroom": self.headroom,
            "cold_start_samples_s": list(self.cold_start_samples_s),
            "decisions": list(self.decisions),
            "policy_state": self.policy_state,
            "saved_at_s": self.saved_at_s,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "history") -> History:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            found = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{where}: format version {found!r} is not {FORMAT_VERSION}")
        samples = data.get("cold_start_samples_s") or []
        decisions = data.get("decisions") or []
        if not all(isinstance(s, int | float) for s in samples):
            raise ValueError(f"{where}: cold_start_samples_s={samples!r} must be numbers")
        if not isinstance(decisions, list) or not all(isinstance(d, dict) for d in decisions):
            raise ValueError(f"{where}: decisions must be a list of objects")
        return cls(
            forecaster=data.get("forecaster"),
            headroom=data.get("headroom"),
            cold_start_samples_s=[float(s) for s in samples],
            decisions=decisions[-MAX_DECISIONS:],
            policy_state=data.get("policy_state"),
            saved_at_s=data.get("saved_at_s"),
        )


def default_history_path(app_name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in app_name)
    return os.path.join(os.path.expanduser("~/.cache/tideserve"), f"autoscaler-{safe}.json")


def decision_record(
    model_now_s: float,
    wall_s: float,
    decision: Any,  # autoscaling.policy.Decision
    forecast: Any,  # autoscaling.forecast.Forecast
    rate_rps: float | None,
    hot_running: int,
    cold_running: int,
    signals: Any,  # autoscaling.live_tick.PoolView
) -> dict[str, Any]:
    """One tick as stored in the history and shown by `status` (plain JSON)."""
    return {
        "t_model_s": model_now_s,
        "t_wall_s": wall_s,
        "hot_target": decision.hot_target,
        "cold_target": decision.cold_target,
        "emergency": decision.emergency,
        "lead_s": decision.lead_s,
        "reason": decision.reason,
        "rate_rps": rate_rps,
        "forecast": {
            "rate_at_lead_rps": forecast.rate_at_lead_rps,
            "peak_rps": forecast.peak_rps,
            "basis": forecast.basis,
        },
        "hot_running": hot_running,
        "cold_running": cold_running,
        "queue_depth": signals.queue_depth,
        "queue_wait_s": signals.queue_wait_s,
        # the per-replica capacity planned with, after adapter slot loads' derating
        "capacity_rps": decision.details.get("capacity_rps"),
        "adapter_miss_s_per_request": signals.adapter_miss_s_per_request,
    }


def load_history(path: str | os.PathLike) -> History | None:
    """The stored history, or None when there is no file yet."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{os.fspath(path)}: not valid JSON ({err})") from None
    return History.from_dict(data, where=os.fspath(path))


def save_history(path: str | os.PathLike, history: History) -> None:
    """Write atomically: readers see the old file or the new one, never half of one."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".history-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(history.to_dict(), f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
