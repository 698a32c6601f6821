"""Admission that needs both KV and an adapter slot: the KV ledger with the slot pool as a gate.

The scheduler asks the ledger `slot_free` (then `need`) before it admits and calls `admit` /
`release` around a request's run (finish, abort, preemption); this ledger adds the adapter's
slot to each, so a request is admitted only when its adapter holds or can take a slot, and a
slot it pins is never evicted while it runs. A request refused for a slot waits at the head of
its tier's queue (AdmissionStop reason "adapter"), as it would for KV (no overtaking: the
scheduler's rule for every admission refusal). Prefix-cached blocks are per adapter: the ledger
salts each sequence's hash chain with its adapter (KVLedger._root_of).
"""

from __future__ import annotations

from serving.engine.ledger import KVLedger, PrefixMatch
from serving.engine.lora.manager import LoraManager
from serving.engine.sequence import Sequence


class AdapterLedger(KVLedger):
    def __init__(self, *args, adapters: LoraManager, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.adapters = adapters

    def slot_free(self, seq: Sequence) -> bool:
        return self.adapters.can_pin(seq)

    def can_admit(self, seq: Sequence, first_chunk_tokens: int) -> bool:
        return self.slot_free(seq) and super().can_admit(seq, first_chunk_tokens)

    def admit(self, seq: Sequence, match: PrefixMatch | None = None) -> None:
        super().admit(seq, match)
        self.adapters.pin(seq)

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        self.adapters.unpin(seq)

    def check_integrity(self) -> None:
        super().check_integrity()
        self.adapters.check_integrity()
