"""The adapter slot pool: a bounded number of slots, LRU eviction, pins that eviction respects.

Pure bookkeeping (no torch): which adapter holds which slot, how many running requests use it
(pins), and the order of last use. Check-then-commit like the KV ledger: `plan(name)` says what
acquiring would do without changing anything (a hit, a load into a free slot, a load that evicts
the least recently used unpinned adapter, or a refusal when every slot is pinned), and
`commit(plan, ...)` does it. A pinned adapter is never evicted: its slot's weights are being read
by a running request's rows.

    invariants: slot_of and name_of are inverse; free + held == num_slots;
                pins > 0 only for held adapters; lru holds exactly the held adapters
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hit:
    slot: int


@dataclass(frozen=True, slots=True)
class Load:
    """Load the adapter into `slot`, first evicting `evict` (None: the slot is free)."""

    slot: int
    evict: str | None


@dataclass(frozen=True, slots=True)
class AllPinned:
    """Every slot holds an adapter a running request uses: wait until one finishes."""

    num_slots: int


Plan = Hit | Load | AllPinned


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_slots = num_slots
        self.slot_of: dict[str, int] = {}
        self.name_of: dict[int, str] = {}
        self.pins: dict[str, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._lru: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.num_loads = 0
        self.num_evictions = 0
        self.num_hits = 0

    def plan(self, name: str) -> Plan:
        """What acquiring `name` would do now; changes nothing."""
        if name in self.slot_of:
            return Hit(self.slot_of[name])
        if self._free:
            return Load(self._free[-1], None)
        for victim in self._lru:  # least recently used first
            if self.pins.get(victim, 0) == 0:
                return Load(self.slot_of[victim], victim)
        return AllPinned(self.num_slots)

    def commit(self, name: str, plan: Hit | Load) -> int:
        """Carry out a plan `plan(name)` returned in this same state; returns the slot.
        The caller writes the weights into the slot after a Load."""
        if isinstance(plan, Hit):
            assert self.slot_of.get(name) == plan.slot, "stale plan"
            self.num_hits += 1
        else:
            if plan.evict is None:
                assert self._free and self._free[-1] == plan.slot, "stale plan"
                self._free.pop()
            else:
                assert self.pins.get(plan.evict, 0) == 0, "evicting a pinned adapter"
                assert self.slot_of.get(plan.evict) == plan.slot, "stale plan"
                self._drop(plan.evict)
                self.num_evictions += 1
            self.slot_of[name] = plan.slot
            self.name_of[plan.slot] = name
            self.num_loads += 1
        self._lru[name] = None
        self._lru.move_to_end(name)
        return plan.slot

    def pin(self, name: str) -> None:
        assert name in self.slot_of, f"pinning {name!r}, which holds no slot"
        self.pins[name] = self.pins.get(name, 0) + 1

    def unpin(self, name: str) -> None:
        count = self.pins.get(name, 0)
        assert count > 0, f"unpinning {name!r}, which no request pins"
        if count == 1:
            del self.pins[name]
        else:
            self.pins[name] = count - 1

    def remove(self, name: str) -> bool:
        """Forget an unpinned adapter (unload); False if it is pinned. Absent: True."""
        if name not in self.slot_of:
            return True
        if self.pins.get(name, 0):
            return False
        self._free.append(self._drop(name))
        return True

    def _drop(self, name: str) -> int:
        slot = self.slot_of.pop(name)
        del self.name_of[slot]
        del self._lru[name]
        return slot

    @property
    def num_free(self) -> int:
        return len(self._free)

    def check_integrity(self) -> None:
        assert len(self._free) + len(self.slot_of) == self.num_slots, "slot leak"
        assert set(self._free).isdisjoint(self.name_of), "a free slot is held"
        assert all(self.name_of[s] == n for n, s in self.slot_of.items()), "maps disagree"
        assert set(self._lru) == set(self.slot_of), "LRU order out of step with the slots"
        assert set(self.pins) <= set(self.slot_of), "a pin on an adapter with no slot"
        assert all(c > 0 for c in self.pins.values()), "a zero pin count kept"
