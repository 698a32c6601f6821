"""KV ledger = reservations + blocks (decision 2, docs/design.md), and the sliding concurrency
window (R8).

reserve:   admission reserves blocks for prompt + max_tokens; sum of reservations <= total, and
           every sequence grows only inside its reservation, so growth cannot fail (zero OOM).
on_demand: admission needs blocks for the first chunk plus a small free margin; growth may be
           refused, and the scheduler then preempts by recompute.

Sliding windows: before a sequence grows, the blocks its window has left are freed
(BlockPool.trim), so it holds at most capacity.memory.seq_blocks(...) blocks while it runs chunks
of up to `chunk_tokens`; reserve mode reserves exactly that, so growth still cannot fail.
"""

from __future__ import annotations

import math

from capacity.memory import seq_blocks
from serving.engine.kv_blocks import BlockPool, Refused
from serving.engine.sequence import Sequence


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
        self.num_reserved_blocks = 0
        self._free_margin = math.ceil(on_demand_free_fraction * pool.num_blocks)

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

    def can_admit(self, seq: Sequence, first_chunk_tokens: int) -> bool:
        if self.mode == "reserve":
            need = self.reservation_for(seq)
            return self.num_reserved_blocks + need <= self.pool.num_blocks
        need = self.pool.blocks_to_grow(
            seq.request_id, seq.num_computed_tokens + first_chunk_tokens
        )
        return need + self._free_margin <= self.pool.num_free_blocks

    def admit(self, seq: Sequence) -> None:
        """Commit an admission `can_admit` approved (reserve mode books the whole reservation)."""
        if self.mode == "reserve":
            need = self.reservation_for(seq)
            self._reserved[seq.request_id] = need
            self.num_reserved_blocks += need

    def grow(self, seq: Sequence, num_tokens: int) -> list[int] | Refused:
        """Free what the windows have left behind, then grow to `num_tokens` (all or nothing)."""
        self.pool.trim(seq.request_id, seq.num_computed_tokens)
        return self.pool.grow(seq.request_id, num_tokens)

    def release(self, seq: Sequence) -> None:
        """Free the blocks and the reservation of a sequence (finish, abort or preemption)."""
        self.pool.free(seq.request_id)
        self.num_reserved_blocks -= self._reserved.pop(seq.request_id, 0)

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        assert self.num_reserved_blocks == sum(self._reserved.values()), "reservation drift"
        assert self.num_reserved_blocks <= self.pool.num_blocks, "over-reserved"
        for seq_id in self.pool.tables():
            held = self.pool.num_live_blocks(seq_id)
            if self.mode == "reserve":
                assert held <= self._reserved.get(seq_id, 0), (
                    f"{seq_id} holds {held} blocks beyond its reservation"
                )
