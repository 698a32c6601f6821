"""Offline pacing: while interactive traffic is live, offline-only steps leave the engine idle
part of the time, so that the next interactive request more often finds it free.

A step cannot be interrupted. An interactive request that arrives while an offline-only step runs
waits for the rest of it (half a step on average), and with a flood of offline work queued the
engine is never idle, so every such arrival pays that wait. `offline_step_tokens` already keeps
those steps small, but a step's fixed cost (every layer's weights, whatever the batch) stays.
With `offline_duty_fraction` d < 1, after an offline-only step of s seconds the driver rests
s x (1/d - 1) seconds, ending early when any request arrives: offline work keeps about d of the
engine's time between interactive requests, and an arrival finds the engine idle about 1 - d of
the time. Only while an interactive request arrived within the scheduler's recent window; a
night of batch work alone runs at full speed.

`rest_after_s` is the pure rule; `OfflinePacer` is the engine observer that applies it after
every step on the stepping thread, for the async driver to read (serving/engine/driver.py).
"""

from __future__ import annotations

from serving.engine.sequence import Tier


def rest_after_s(step_s: float, offline_only: bool, interactive_recent: bool, duty: float) -> float:
    """Seconds to leave the engine idle after a step of step_s (0: step on at once)."""
    if duty >= 1.0 or not offline_only or not interactive_recent:
        return 0.0
    return step_s * (1.0 / duty - 1.0)


class OfflinePacer:
    """An engine observer (`engine.observers`): the rest owed after the latest step."""

    def __init__(self, duty: float) -> None:
        self.duty = duty
        self.rest_s = 0.0

    def on_step(self, engine, now: float, step_s: float, batch, touched) -> None:
        offline_only = bool(batch.seqs) and all(s.tier is Tier.OFFLINE for s in batch.seqs)
        recent = engine.scheduler.interactive_recent(now)
        self.rest_s = rest_after_s(step_s, offline_only, recent, self.duty)
