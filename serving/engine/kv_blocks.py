"""Fixed pool of KV blocks with per-sequence block tables; check-then-commit, refusal is a value.

A sequence of n tokens has ceil(n / block_size) entries in its block table, in order; token at
position p lives in slot table[p // block_size] * block_size + p % block_size of the cache.

Paging groups (capacity.memory.paging_layout): layers that share a sliding window share pages,
and each group keeps its own table of every sequence, drawing pages from this one pool. Group 0
(the largest window; None = full) is the table the runner reads. A group with a window frees
the entries no later query can see (`trim`): those become NULL (`null_block`, one block past the
pool that no table owns and no kernel writes; reads of it are always masked out), so tables keep
their length and positions keep their entry. For groups g > 0, `group_map(g)[b]` is the page of
group g that holds what group 0 holds in page b, so the attention translates group 0's block
ids (serving/engine/attention.py).

  entry j of a table (tokens j*bs .. j*bs+bs-1):  trimmed (NULL) | live ... | live (last)
  trimmed while its last token is older than the window of the next query: (j+1)*bs <= c-w+1
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from capacity.memory import blocks_for_tokens


@dataclass(frozen=True, slots=True)
class Refused:
    """Why an allocation did not happen; nothing was changed."""

    num_needed_blocks: int
    num_free_blocks: int


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size_tokens: int,
        group_windows: tuple[int | None, ...] = (None,),
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        if not group_windows or any(w is not None and w < 1 for w in group_windows):
            raise ValueError(f"group_windows={group_windows} must name >= 1 window, each >= 1")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self.group_windows = tuple(group_windows)
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: list[dict[str, list[int]]] = [{} for _ in group_windows]
        self._trimmed: list[dict[str, int]] = [{} for _ in group_windows]  # leading NULLs
        # one int64 per block (+ NULL) for each group but the first
        self._maps = [None] + [
            array("q", [self.null_block] * (num_blocks + 1)) for _ in group_windows[1:]
        ]

    @property
    def null_block(self) -> int:
        """The block id of trimmed entries: one past the pool (the cache holds it, unowned)."""
        return self.num_blocks

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def table(self, seq_id: str, group: int = 0) -> list[int]:
        return self._tables[group].get(seq_id, [])

    def tables(self, group: int = 0) -> dict[str, list[int]]:
        """Every live block table of a group, by sequence id (read-only by convention)."""
        return self._tables[group]

    def group_map(self, group: int) -> array:
        """Group 0 page -> group `group` page (NULL where none), for group >= 1: an int64
        buffer, updated in place, that torch.frombuffer can view without copying."""
        page_map = self._maps[group]
        if page_map is None:
            raise ValueError("group 0 reads its own block ids; it has no map")
        return page_map

    def num_live_blocks(self, seq_id: str) -> int:
        return sum(len(t.get(seq_id, ())) - tr.get(seq_id, 0) for t, tr in self._groups())

    def _groups(self):
        return zip(self._tables, self._trimmed, strict=True)

    def blocks_to_grow(self, seq_id: str, num_tokens: int) -> int:
        """Extra blocks `seq_id` needs to hold `num_tokens` tokens in total, all groups."""
        want = blocks_for_tokens(num_tokens, self.block_size_tokens)
        return sum(max(0, want - len(t.get(seq_id, ()))) for t in self._tables)

    def grow(self, seq_id: str, num_tokens: int) -> list[int] | Refused:
        """Extend every group's table of `seq_id` to hold `num_tokens` tokens; all or nothing.
        Returns group 0's table."""
        need = self.blocks_to_grow(seq_id, num_tokens)
        if need > len(self._free):
            return Refused(need, len(self._free))
        want = blocks_for_tokens(num_tokens, self.block_size_tokens)
        first = self._tables[0].setdefault(seq_id, [])
        start = len(first)
        pop = self._free.popleft
        for tables in self._tables:
            table = tables.setdefault(seq_id, [])
            while len(table) < want:
                table.append(pop())
        for g in range(1, self.num_groups):
            table, page_map = self._tables[g][seq_id], self.group_map(g)
            for j in range(start, want):
                page_map[first[j]] = table[j]
        return first

    def trim(self, seq_id: str, num_computed_tokens: int) -> int:
        """Free the entries of windowed groups that no query at >= num_computed_tokens sees."""
        freed = 0
        for g, window in enumerate(self.group_windows):
            if window is None or seq_id not in self._tables[g]:
                continue
            table, done = self._tables[g][seq_id], self._trimmed[g].get(seq_id, 0)
            upto = min(
                max(0, num_computed_tokens - window + 1) // self.block_size_tokens, len(table)
            )
            for j in range(done, upto):
                self._free.append(table[j])
                if g:  # group 0's page j (if still live) no longer maps to a page here
                    self.group_map(g)[self._tables[0][seq_id][j]] = self.null_block
                table[j] = self.null_block
            if upto > done:
                self._trimmed[g][seq_id] = upto
                freed += upto - done
        return freed

    def free(self, seq_id: str) -> int:
        """Return all blocks of `seq_id` to the pool; returns how many."""
        freed = 0
        for tables, trimmed in self._groups():
            table = tables.pop(seq_id, [])
            live = table[trimmed.pop(seq_id, 0) :]
            self._free.extend(live)
            freed += len(live)
        return freed

    def check_integrity(self) -> None:
        """free + used == total, no block twice, every id in range. Raises AssertionError."""
        used = [b for t, tr in self._groups() for s, tab in t.items() for b in tab[tr.get(s, 0) :]]
        free = list(self._free)
        assert len(free) + len(used) == self.num_blocks, (
            f"free {len(free)} + used {len(used)} != total {self.num_blocks}"
        )
        every = set(free) | set(used)
        assert len(every) == self.num_blocks, "a block is both free and used, or owned twice"
        assert min(every) == 0 and max(every) == self.num_blocks - 1, "block id out of range"
        assert all(t for tables in self._tables for t in tables.values()), "empty table left"
        for tables, trimmed in self._groups():
            for seq_id, table in tables.items():
                done = trimmed.get(seq_id, 0)
                assert all(b == self.null_block for b in table[:done]), f"{seq_id}: stale entry"
