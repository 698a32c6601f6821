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

Prefix caching (decision 9; serving/engine/prefix_cache.py; single full-attention group only):
every block has a reference count, the number of tables holding it. A full block whose KV is
computed is registered under its chained hash (`commit`); a new sequence maps the longest
registered run of its prompt (`match`, `share`). A block whose count falls to 0 stays registered
and becomes evictable (least recently freed first); `_take` hands out never-registered free
blocks first, then evicts. The last, partial block of a finished sequence is cached too, under
its parent's hash and its tokens (serving/engine/partial_blocks.py), until one request takes it
over (`share(..., partial=)`). Every block is in exactly one state:

  free       count 0, no hash                  in _free
  cached     count 0, hash or partial record   in _evictable (LRU order)
  used       count >= 1 (hash or not)          in one table or more
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

from capacity.memory import blocks_for_tokens
from serving.engine.partial_blocks import PartialIndex, PartialTail


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
        self._refs = [0] * num_blocks  # tables holding each block
        self.num_extra_refs = 0  # sum over used blocks of (count - 1): shared holdings
        self.caching = False
        self._hash_of: dict[int, bytes] = {}  # registered block -> its hash
        self._block_of: dict[bytes, int] = {}  # hash -> registered block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, LRU first
        self._partials = PartialIndex()  # cached partial blocks of finished sequences
        self._num_committed: dict[str, int] = {}  # leading blocks of a table already offered
        self.num_evicted_blocks = 0  # cached blocks taken for new KV, ever
        self.num_partial_takeovers = 0  # cached partial blocks a new sequence continued in, ever

    def enable_caching(self) -> None:
        """Keep computed full blocks for reuse; only for a single full-attention group."""
        if self.group_windows != (None,):
            raise ValueError(
                f"prefix caching needs one full-attention paging group; this pool has windows "
                f"{self.group_windows}"
            )
        self.caching = True

    @property
    def null_block(self) -> int:
        """The block id of trimmed entries: one past the pool (the cache holds it, unowned)."""
        return self.num_blocks

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    @property
    def num_free_blocks(self) -> int:
        """Blocks a grow may take: never-registered ones, then cached ones (evicted)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks no table holds that keep their KV for reuse (evictable)."""
        return len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Distinct blocks held by tables (a block shared by several counts once)."""
        return self.num_blocks - self.num_free_blocks

    def ref_count(self, block: int) -> int:
        return self._refs[block]

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
        if need > self.num_free_blocks:
            return Refused(need, self.num_free_blocks)
        want = blocks_for_tokens(num_tokens, self.block_size_tokens)
        first = self._tables[0].setdefault(seq_id, [])
        start = len(first)
        pop = self._take
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
                self._drop(table[j])
                if g:  # group 0's page j (if still live) no longer maps to a page here
                    self.group_map(g)[self._tables[0][seq_id][j]] = self.null_block
                table[j] = self.null_block
            if upto > done:
                self._trimmed[g][seq_id] = upto
                freed += upto - done
        return freed

    def free(self, seq_id: str, tail: PartialTail | None = None) -> int:
        """Drop every block `seq_id` holds; returns how many it held. Blocks still held by
        another table stay used; registered ones become cached (evictable), and so does the
        partial block `tail` describes (caching on); the rest free."""
        freed = 0
        self._num_committed.pop(seq_id, None)
        for g, (tables, trimmed) in enumerate(self._groups()):
            table = tables.pop(seq_id, [])
            kept = table[tail.index] if g == 0 and tail and tail.index < len(table) else None
            live = table[trimmed.pop(seq_id, 0) :]
            for block in reversed(live):  # the tail is evicted before the prefix it extends
                self._drop(block, tail if block == kept else None)
            freed += len(live)
        return freed

    def _take(self) -> int:
        """One block for a growing table: a never-registered free one, else the least recently
        cached one (its hash is forgotten: its KV is about to be overwritten)."""
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            if block in self._partials:
                self._partials.remove(block)
            else:
                del self._block_of[self._hash_of.pop(block)]
            self.num_evicted_blocks += 1
        self._refs[block] = 1
        return block

    def _drop(self, block: int, tail: PartialTail | None = None) -> None:
        """A table lets go of `block` (the partial block `tail` describes, if given)."""
        self._refs[block] -= 1
        if self._refs[block] > 0:
            self.num_extra_refs -= 1
        elif block in self._hash_of:
            self._evictable[block] = None
        elif tail is not None and self.caching:
            self._evictable[block] = None
            pushed_out = self._partials.add(block, tail.parent, tail.token_ids)
            if pushed_out is not None:
                del self._evictable[pushed_out]
                self._free.append(pushed_out)
        else:
            self._free.append(block)

    # ----- prefix caching ----------------------------------------------------------------
    def match(self, hashes: list[bytes], max_blocks: int) -> list[int]:
        """The registered blocks of the longest run of `hashes[:max_blocks]`, in order."""
        if not self.caching:
            return []
        blocks = []
        for h in hashes[:max_blocks]:
            block = self._block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def match_partial(self, parent: bytes, token_ids: list[int]) -> tuple[int, int] | None:
        """(block, tokens) of the cached partial block after `parent` that shares the longest
        run with `token_ids`, or None (PartialIndex.best)."""
        return self._partials.best(parent, token_ids) if self.caching else None

    def num_live_shared(self, blocks: list[int]) -> int:
        """How many of `blocks` some table already holds (mapping them takes no free block)."""
        return sum(1 for b in blocks if self._refs[b] > 0)

    def share(self, seq_id: str, blocks: list[int], partial: int | None = None) -> None:
        """Start `seq_id`'s table with cached `blocks` (from `match`; it must hold none), then
        the cached `partial` block (from `match_partial`), which it takes over: it leaves the
        cache and is this table's own, written on after the tokens it shares."""
        assert not self.table(seq_id), f"{seq_id} already holds blocks"
        if not blocks and partial is None:
            return
        for block in blocks:
            if self._refs[block] == 0:
                del self._evictable[block]
            else:
                self.num_extra_refs += 1
            self._refs[block] += 1
        table = list(blocks)
        if partial is not None:
            self._partials.remove(partial)
            del self._evictable[partial]
            self._refs[partial] = 1
            table.append(partial)
            self.num_partial_takeovers += 1
        self._tables[0][seq_id] = table
        self._num_committed[seq_id] = len(blocks)

    def commit(self, seq_id: str, hashes: list[bytes], num_computed_tokens: int) -> int:
        """Register the full blocks of `seq_id` whose KV is now computed (the first
        num_computed_tokens tokens); `hashes` covers them. A block whose prefix is already
        registered (two equal prompts prefilled at once) stays private. Returns how many."""
        if not self.caching:
            return 0
        table = self._tables[0].get(seq_id, ())
        done = self._num_committed.get(seq_id, 0)
        full = min(num_computed_tokens // self.block_size_tokens, len(table))
        added = 0
        for j in range(done, full):
            block, h = table[j], hashes[j]
            if block not in self._hash_of and h not in self._block_of:
                self._hash_of[block], self._block_of[h] = h, block
                added += 1
        if full > done:
            self._num_committed[seq_id] = full
        return added

    def check_integrity(self) -> None:
        """free + used + cached == total, each block in one state, reference counts equal to
        the tables holding each block, registrations consistent. Raises AssertionError."""
        held = [b for t, tr in self._groups() for s, tab in t.items() for b in tab[tr.get(s, 0) :]]
        used, free, cached = set(held), list(self._free), list(self._evictable)
        assert len(free) + len(used) + len(cached) == self.num_blocks, (
            f"free {len(free)} + used {len(used)} + cached {len(cached)} != total {self.num_blocks}"
        )
        every = set(free) | used | set(cached)
        assert len(every) == self.num_blocks, "a block is in two states at once"
        assert min(every) == 0 and max(every) == self.num_blocks - 1, "block id out of range"
        counts = [0] * self.num_blocks
        for b in held:
            counts[b] += 1
        assert counts == self._refs, "a reference count differs from the tables holding it"
        assert self.num_extra_refs == len(held) - len(used), "shared-holding count drift"
        assert all((b in self._hash_of) != (b in self._partials) for b in cached), (
            "a cached block has no hash and no partial record, or both"
        )
        assert not any(b in self._hash_of or b in self._partials for b in free), (
            "a free block keeps a hash"
        )
        assert not any(b in self._partials for b in used), "a used block is still a partial"
        self._partials.check_integrity()
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "hash map drift"
        assert len(self._block_of) == len(self._hash_of), "hash map drift"
        assert all(t for tables in self._tables for t in tables.values()), "empty table left"
        for tables, trimmed in self._groups():
            for seq_id, table in tables.items():
                done = trimmed.get(seq_id, 0)
                assert all(b == self.null_block for b in table[:done]), f"{seq_id}: stale entry"
