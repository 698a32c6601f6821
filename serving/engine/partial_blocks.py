"""Cached partial blocks: the last, not yet full block of a sequence that finished.

A chat resends its history every turn. Full blocks are found by their hash (prefix_cache.py), but
a reply rarely ends on a block boundary: without this, the next turn recomputes the previous
turn's last partial block, on average block_size / 2 tokens of every turn's uncached tail
(7.5 of ~32 tokens per turn in benchmarks/prefix_cache.py's chat). So when a sequence finishes,
its last block keeps the KV of its computed tokens and is recorded here under the chained hash
of the full blocks before it (the parent). A new request whose full-block match ends at that
parent and whose next tokens begin with the block's tokens takes the block over: it is removed
from this index, the request continues writing in it after the shared tokens, and no copy is
made. A block is taken over by one request only; a second one recomputes those tokens.

Only finished sequences offer their tail (KVLedger.release): every token before the last one
has its KV written then. An aborted or preempted sequence offers none.

The blocks here are cached blocks (count 0, in the pool's evictable set, evicted LRU like the
full ones); a parent keeps at most MAX_PER_PARENT of them (the oldest is freed), so a lookup
scans a handful of candidates whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_PER_PARENT = 4


@dataclass(frozen=True, slots=True)
class PartialTail:
    """What a finished sequence's last block holds: its entry in the table, the chained hash of
    the full blocks before it (the chain's root for entry 0) and the tokens whose KV is written
    (1 to block_size - 1 of them)."""

    index: int
    parent: bytes
    token_ids: tuple[int, ...]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PartialIndex:
    """parent hash -> {block: token ids} (insertion order = age), and block -> parent."""

    def __init__(self) -> None:
        self._by_parent: dict[bytes, dict[int, tuple[int, ...]]] = {}
        self._parent_of: dict[int, bytes] = {}

    def __contains__(self, block: int) -> bool:
        return block in self._parent_of

    def __len__(self) -> int:
        return len(self._parent_of)

    def add(self, block: int, parent: bytes, token_ids: tuple[int, ...]) -> int | None:
        """Record `block`; returns the block pushed out (its parent's oldest, past
        MAX_PER_PARENT), which the caller frees, or None."""
        held = self._by_parent.setdefault(parent, {})
        held[block] = token_ids
        self._parent_of[block] = parent
        if len(held) <= MAX_PER_PARENT:
            return None
        oldest = next(iter(held))
        self.remove(oldest)
        return oldest

    def remove(self, block: int) -> None:
        parent = self._parent_of.pop(block)
        held = self._by_parent[parent]
        del held[block]
        if not held:
            del self._by_parent[parent]

    def best(self, parent: bytes, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """(block, number of tokens) of the block under `parent` whose tokens share the longest
        run with `token_ids` (the request's tokens after its full-block match, already cut so
        that one token is left to compute), or None when none shares a token."""
        found: tuple[int, int] | None = None
        for block, held in self._by_parent.get(parent, {}).items():
            n = common_prefix(held, token_ids)
            if n and (found is None or n > found[1]):
                found = (block, n)
        return found

    def check_integrity(self) -> None:
        assert all(
            self._parent_of.get(b) == p for p, held in self._by_parent.items() for b in held
        ), "partial index drift"
        assert sum(len(h) for h in self._by_parent.values()) == len(self._parent_of), (
            "partial index drift"
        )
        assert all(0 < len(held) <= MAX_PER_PARENT for held in self._by_parent.values())
