"""Why one admission pass stopped: a value the scheduler returns, not a string field it sets.

The step's batch carries it (ScheduledBatch.admission_stop), so whoever watches the steps (the
concurrency tuner's window, serving/engine/window.py) reads which limit bound and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.tiers import Tier

# empty: no queue had work; ceiling: the concurrency window at max_num_seqs; kv: the KV (the
# ledger refused the head, or the window slid below max_num_seqs with KV use); budget: the
# step's token budget ran out; offline: offline work held back (idle rule, share or step cap);
# adapter: every LoRA slot is pinned by running requests of other adapters.
StopReason = Literal["empty", "ceiling", "kv", "budget", "offline", "adapter"]
Unit = Literal["", "blocks", "seqs", "tokens", "slots"]


@dataclass(frozen=True, slots=True)
class AdmissionStop:
    """The limit that stopped admission, with what the refused head needed and what was left
    (in `unit`: KV blocks, running sequences, or step tokens; zeros when nothing was refused)."""

    reason: StopReason
    tier: Tier | None = None  # the queue whose head was refused
    needed: int = 0
    available: int = 0
    unit: Unit = ""

    @property
    def refused(self) -> bool:
        return self.reason != "empty"


NOTHING_WAITING = AdmissionStop("empty")
