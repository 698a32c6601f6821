"""KV ledger = reservations + blocks (decision 2, docs/design.md), and the sliding concurrency
window (R8).

reserve:   admission reserves blocks for prompt + max_tokens; sum of reservations <= total, and
           every sequence grows only inside its reservation, so growth cannot fail (zero OOM).
on_demand: admission needs blocks for the first chunk plus a small free margin; growth may be
           refused, and the scheduler then preempts by recompute.

Prefix caching (decision 9): a sequence starts from the cached blocks of its prompt (`match`),
and owns only what it adds. A finished sequence's last partial block stays cached as well
(serving/engine/partial_blocks.py); the one request that takes it over owns it from then on, so
it counts like any block that request grows into. In reserve mode each sequence books its whole
reservation, and a block that k tables hold counts once, so the booked total is
    num_reserved_blocks = sum(reservations) - pool.num_extra_refs     (<= num_blocks, kept)
Growth still cannot fail: the blocks running sequences may still take are
    sum(reservation - held) = num_reserved_blocks - used <= num_blocks - used = free + cached,
and a grow may take cached blocks (evicting them) but never a used one. Releasing a sequence
never raises the total (it drops its reservation, at least the shared blocks it held).

Sliding windows: before a sequence grows, the blocks its window has left are freed
(BlockPool.trim), so it holds at most capacity.memory.seq_blocks(...) blocks while it runs chunks
of up to `chunk_tokens`; reserve mode reserves exactly that, so growth still cannot fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity.memory import seq_blocks
from serving.engine.kv_blocks import BlockPool, Refused
from serving.engine.partial_blocks import PartialTail
from serving.engine.prefix_cache import adapter_root, extend_block_hashes
from serving.engine.sequence import SeqStatus, Sequence

# A sequence that ends so has the KV of all its tokens but the last written: its partial block
# may be reused. An abort or a preemption may stop one mid-step: it offers none.
OFFERS_TAIL = frozenset({SeqStatus.FINISHED_STOPPED, SeqStatus.FINISHED_LENGTH})


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """What a waiting sequence can start from: cached full `blocks` (shared), then possibly a
    cached partial block it takes over, holding its next `num_partial_tokens` tokens."""

    blocks: tuple[int, ...] = ()
    partial_block: int | None = None
    num_partial_tokens: int = 0

    def num_tokens(self, block_size_tokens: int) -> int:
        """Prompt tokens whose KV the match provides (the sequence starts computing after)."""
        return len(self.blocks) * block_size_tokens + self.num_partial_tokens


NO_MATCH = PrefixMatch()


@dataclass(frozen=True, slots=True)
class KVNeed:
    """What admitting a sequence's first chunk takes from the KV, against what is left."""

    num_needed_blocks: int
    num_available_blocks: int

    @property
    def fits(self) -> bool:
        return self.num_needed_blocks <= self.num_available_blocks


def concurrency_limit(
    kv_use_fraction: float, min_num_seqs: int, max_num_seqs: int, low: float, high: float
) -> int:
    """The window slides linearly from max_num_seqs (use <= low) to min_num_seqs (use >= high)."""
    if kv_use_fraction <= low:
        return max_num_seqs
    if kv_use_fraction >= high or high <= low:
        return min_num_seqs
    frac = (kv_use_fraction - low) / (high - low)
    return round(max_num_seqs - frac * (max_num_seqs - min_num_seqs))


class KVLedger:
    def __init__(
        self,
        pool: BlockPool,
        mode: str,
        on_demand_free_fraction: float = 0.0,
        chunk_tokens: int = 2**31,
    ) -> None:
        self.pool = pool
        self.mode = mode
        self.chunk_tokens = chunk_tokens  # the largest chunk a step runs (max_num_batched_tokens)
        self._reserved: dict[str, int] = {}
        self._sum_reserved = 0  # sum(self._reserved.values())
        self._free_margin = math.ceil(on_demand_free_fraction * pool.num_blocks)
        self.root_hash = b""  # the prefix cache's chain start (enable_prefix_caching)
        # Bumped when an adapter is removed: blocks its old weights computed become unreachable
        # (evicted LRU) even if other weights are later registered under the same name.
        self._adapter_epochs: dict[str, int] = {}
        # Prompt tokens looked up in the prefix cache at admission, and those found (vLLM's
        # prefix_cache_queries / prefix_cache_hits, both in tokens).
        self.num_query_tokens = 0
        self.num_hit_tokens = 0

    def enable_prefix_caching(self, root_hash: bytes) -> None:
        self.pool.enable_caching()
        self.root_hash = root_hash

    def _root_of(self, seq: Sequence) -> bytes:
        """The chain start of `seq`'s blocks: a LoRA adapter changes every K/V it computes, so
        blocks of different adapters (or of the base model) never share a hash."""
        if seq.adapter is None:
            return self.root_hash
        return adapter_root(self.root_hash, seq.adapter, self._adapter_epochs.get(seq.adapter, 0))

    def forget_adapter(self, name: str) -> None:
        """An adapter was removed: its cached blocks must never match again."""
        self._adapter_epochs[name] = self._adapter_epochs.get(name, 0) + 1

    @property
    def num_reserved_blocks(self) -> int:
        """Reserve mode: blocks booked by running sequences, a shared block counted once."""
        return self._sum_reserved - self.pool.num_extra_refs if self._reserved else 0

    def blocks_for(self, num_tokens: int) -> int:
        """Most blocks a sequence of `num_tokens` holds at once (all paging groups)."""
        pool = self.pool
        return seq_blocks(pool.group_windows, num_tokens, pool.block_size_tokens, self.chunk_tokens)

    def reservation_for(self, seq: Sequence) -> int:
        """Blocks that cover the longest this sequence can become."""
        return self.blocks_for(seq.max_len_tokens)

    @property
    def use_fraction(self) -> float:
        """KV use that drives the window: reserved blocks in reserve mode, used blocks otherwise."""
        busy = max(self.num_reserved_blocks, self.pool.num_used_blocks)
        return busy / self.pool.num_blocks

    def match(self, seq: Sequence) -> PrefixMatch:
        """What a waiting sequence can start from: the longest registered run of its full
        blocks, then the cached partial block that continues it furthest, leaving at least one
        token to compute (its logits are sampled)."""
        pool = self.pool
        if not pool.caching or seq.num_computed_tokens:
            return NO_MATCH
        bs, root = pool.block_size_tokens, self._root_of(seq)
        hashes = extend_block_hashes(seq.block_hashes, seq.token_ids, bs, root)
        blocks = pool.match(hashes, (seq.num_tokens - 1) // bs)
        start = len(blocks) * bs
        parent = hashes[len(blocks) - 1] if blocks else root
        after = seq.token_ids[start : min(start + bs - 1, seq.num_tokens - 1)]
        partial = pool.match_partial(parent, after) if after else None
        if partial is None:
            return PrefixMatch(tuple(blocks))
        return PrefixMatch(tuple(blocks), *partial)

    def need(self, seq: Sequence, match: PrefixMatch, first_chunk_tokens: int) -> KVNeed:
        """What admitting `seq` on top of `match` takes: reserve mode books the reservation
        less the cached blocks already held (counted once); on_demand takes the first chunk's
        new blocks (a taken-over partial block among them), the cached blocks revived from the
        evictable set, and the free margin kept for running decodes."""
        pool = self.pool
        cached = match.blocks
        shared = pool.num_live_shared(cached)
        if self.mode == "reserve":
            need = self.reservation_for(seq) - shared
            return KVNeed(need, pool.num_blocks - self.num_reserved_blocks)
        start = match.num_tokens(pool.block_size_tokens) or seq.num_computed_tokens
        grow = pool.blocks_to_grow(seq.request_id, start + first_chunk_tokens) - len(cached)
        return KVNeed(grow + len(cached) - shared + self._free_margin, pool.num_free_blocks)

    def slot_free(self, seq: Sequence) -> bool:
        """Whatever besides KV `seq` needs is there (AdapterLedger: its LoRA slot)."""
        return True

    def can_admit(self, seq: Sequence, first_chunk_tokens: int) -> bool:
        """Whether `seq`'s first chunk fits, with no cached prefix (tests, callers outside)."""
        return self.need(seq, NO_MATCH, first_chunk_tokens).fits

    def admit(self, seq: Sequence, match: PrefixMatch | None = None) -> None:
        """Commit an admission `need` approved: book the reservation (reserve mode), map the
        matched blocks and skip their tokens, count the lookup."""
        if self.mode == "reserve":
            need = self.reservation_for(seq)
            self._reserved[seq.request_id] = need
            self._sum_reserved += need
        if self.pool.caching and seq.num_computed_tokens == 0:
            match = match or NO_MATCH
            self.pool.share(seq.request_id, list(match.blocks), match.partial_block)
            seq.num_computed_tokens = match.num_tokens(self.pool.block_size_tokens)
            self.num_query_tokens += seq.num_tokens
            self.num_hit_tokens += seq.num_computed_tokens

    def commit(self, seq: Sequence) -> None:
        """After a step computed more of `seq`: offer its newly full blocks to the cache."""
        if self.pool.caching:
            bs = self.pool.block_size_tokens
            hashes = extend_block_hashes(seq.block_hashes, seq.token_ids, bs, self._root_of(seq))
            self.pool.commit(seq.request_id, hashes, seq.num_computed_tokens)

    def grow(self, seq: Sequence, num_tokens: int) -> list[int] | Refused:
        """Free what the windows have left behind, then grow to `num_tokens` (all or nothing)."""
        self.pool.trim(seq.request_id, seq.num_computed_tokens)
        return self.pool.grow(seq.request_id, num_tokens)

    def release(self, seq: Sequence) -> None:
        """Free the blocks and the reservation of a sequence (finish, abort or preemption); a
        finished one leaves its partial last block cached (OFFERS_TAIL)."""
        self.pool.free(seq.request_id, self._tail(seq))
        self._sum_reserved -= self._reserved.pop(seq.request_id, 0)

    def _tail(self, seq: Sequence) -> PartialTail | None:
        """The partial block a finished `seq` leaves for reuse, or None."""
        bs = self.pool.block_size_tokens
        index, num_tokens = divmod(seq.num_computed_tokens, bs)
        if not self.pool.caching or not num_tokens or seq.status not in OFFERS_TAIL:
            return None
        root = self._root_of(seq)
        hashes = extend_block_hashes(seq.block_hashes, seq.token_ids, bs, root)
        start = index * bs
        parent = hashes[index - 1] if index else root
        return PartialTail(index, parent, tuple(seq.token_ids[start : start + num_tokens]))

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        assert self._sum_reserved == sum(self._reserved.values()), "reservation drift"
        assert self.num_reserved_blocks <= self.pool.num_blocks, "over-reserved"
        for seq_id in self.pool.tables():
            held = self.pool.num_live_blocks(seq_id)
            if self.mode == "reserve":
                assert held <= self._reserved.get(seq_id, 0), (
                    f"{seq_id} holds {held} blocks beyond its reservation"
                )
