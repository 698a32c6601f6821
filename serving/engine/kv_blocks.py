"""Fixed pool of KV blocks with per-sequence block tables; check-then-commit, refusal is a value.

A sequence of n tokens owns ceil(n / block_size) blocks, in order, in its block table; token at
position p lives in slot table[p // block_size] * block_size + p % block_size of the cache tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from capacity.memory import blocks_for_tokens


@dataclass(frozen=True, slots=True)
class Refused:
    """Why an allocation did not happen; nothing was changed."""

    num_needed_blocks: int
    num_free_blocks: int


class BlockPool:
    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def table(self, seq_id: str) -> list[int]:
        return self._tables.get(seq_id, [])

    def tables(self) -> dict[str, list[int]]:
        """Every live block table, by sequence id (read-only by convention)."""
        return self._tables

    def blocks_to_grow(self, seq_id: str, num_tokens: int) -> int:
        """Extra blocks `seq_id` needs to hold `num_tokens` tokens in total."""
        have = len(self._tables.get(seq_id, ()))
        return max(0, blocks_for_tokens(num_tokens, self.block_size_tokens) - have)

    def grow(self, seq_id: str, num_tokens: int) -> list[int] | Refused:
        """Extend the table of `seq_id` to hold `num_tokens` tokens; all or nothing."""
        need = self.blocks_to_grow(seq_id, num_tokens)
        if need > len(self._free):
            return Refused(need, len(self._free))
        table = self._tables.setdefault(seq_id, [])
        pop = self._free.popleft
        for _ in range(need):
            table.append(pop())
        return table

    def free(self, seq_id: str) -> int:
        """Return all blocks of `seq_id` to the pool; returns how many."""
        table = self._tables.pop(seq_id, [])
        self._free.extend(table)
        return len(table)

    def check_integrity(self) -> None:
        """free + used == total, no block twice, every id in range. Raises AssertionError."""
        used = [b for t in self._tables.values() for b in t]
        free = list(self._free)
        assert len(free) + len(used) == self.num_blocks, (
            f"free {len(free)} + used {len(used)} != total {self.num_blocks}"
        )
        every = set(free) | set(used)
        assert len(every) == self.num_blocks, "a block is both free and used, or owned twice"
        assert min(every) == 0 and max(every) == self.num_blocks - 1, "block id out of range"
        assert all(self._tables.values()), "empty block table left behind"
