"""The scheduler: per-tier waiting queues, KV admission, chunked prefill, preemption by recompute.

One step's order (each stage only uses the token budget the earlier ones left):
  1. queued requests past their deadline fail (they never touched the KV cache);
  2. running decodes, one token each, so they never stall behind a long prompt;
  3. running sequences still prefilling, in admission order, one chunk each;
  4. admission: interactive, then analytical, then offline (only while KV use is below
     offline_idle_fraction, and on at most that fraction of the concurrency window, so the rest
     of the slots stay free for interactive work arriving next), FIFO within a tier, while the
     concurrency window and the ledger allow.
A tier's head that does not fit stops admission for every lower tier too: no overtaking.
While an interactive prompt is being prefilled, or the interactive queue's head can be admitted
now, the step leaves offline work out (its decodes wait one step, holding their KV): the prompt's
first token is then not computed beside a batch of offline decodes (tier isolation of TTFT). An
interactive head that cannot be admitted holds nothing back, so offline work that holds the KV
it waits for still runs and frees it.
While interactive requests arrived within the last INTERACTIVE_RECENT_S, offline work in one
step is capped at `offline_step_tokens` (decode rows + prefill chunks; at most half of it in
running offline sequences, so the other half still moves prompts): an interactive request that
arrives mid-step waits for the rest of that step, and a 512-token offline prefill chunk would
make that wait longer than the request's own prefill. With no interactive traffic in that
window (a night of batch work) offline steps are as large as the budget allows.
One sequence's chunk never exceeds the ledger's `chunk_tokens`, the largest chunk its
sliding-window reservations assume, even if the step budget is raised later.
Prefix caching: a head starts from the cached blocks of its prompt (KVLedger.match), so its
first chunk and its KV need count only the tokens and blocks it adds; after each step the newly
full blocks of every advanced sequence are offered to the cache (KVLedger.commit), never a block
whose KV is not all written. A finished sequence's partial last block stays cached too, and the
next turn of its conversation continues in it (serving/engine/partial_blocks.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from serving.engine.admission_stop import NOTHING_WAITING, AdmissionStop
from serving.engine.config import EngineConfig
from serving.engine.kv_blocks import Refused
from serving.engine.ledger import KVLedger, PrefixMatch, concurrency_limit
from serving.engine.sequence import SeqStatus, Sequence, Tier

# How long after an interactive arrival offline steps stay capped: interactive traffic comes in
# sessions, and the first request after a quiet minute may still meet one full offline step.
INTERACTIVE_RECENT_S = 60.0


@dataclass(slots=True)
class ScheduledBatch:
    """What one forward runs: decodes first (one token each), then prefill chunks."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    admitted: list[Sequence] = field(default_factory=list)
    timed_out: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admission_stop: AdmissionStop = NOTHING_WAITING  # why admission stopped this step

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether row i reaches its last token this step and so samples the next one."""
        seq = self.seqs[i]
        return seq.num_computed_tokens + self.num_new_tokens[i] == seq.num_tokens


class Scheduler:
    def __init__(self, config: EngineConfig, ledger: KVLedger) -> None:
        self.config = config
        self.ledger = ledger
        self.waiting: dict[Tier, deque[Sequence]] = {t: deque() for t in Tier}
        self.running: list[Sequence] = []
        self._hold_offline = False  # this step leaves offline work out (_interactive_first)
        self._last_interactive_s: float | None = None  # arrival of the latest interactive request
        self._offline_left: int | None = None  # offline tokens this step may still take

    # ----- bookkeeping -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting[seq.tier].append(seq)
        if seq.tier is Tier.INTERACTIVE:
            self._last_interactive_s = max(seq.arrival_s, self._last_interactive_s or seq.arrival_s)

    def num_waiting(self, tier: Tier | None = None) -> int:
        if tier is None:
            return sum(len(q) for q in self.waiting.values())
        return len(self.waiting[tier])

    def has_unfinished(self) -> bool:
        return bool(self.running) or any(self.waiting.values())

    def abort(self, request_id: str) -> Sequence | None:
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self.ledger.release(seq)
                seq.status = SeqStatus.FINISHED_ABORTED
                return seq
        for queue in self.waiting.values():
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self.ledger.release(seq)
                    seq.status = SeqStatus.FINISHED_ABORTED
                    return seq
        return None

    def finish(self, seq: Sequence, status: SeqStatus, now: float) -> None:
        self.running.remove(seq)
        seq.status = status  # before the release: a finished sequence leaves its tail cached
        self.ledger.release(seq)
        seq.finished_s = now

    # ----- schedule ----------------------------------------------------------------------
    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch()
        batch.timed_out = self._expire(now)
        self._yield_offline_slot(batch)
        budget = self.config.max_num_batched_tokens
        self._hold_offline = self._interactive_first()
        self._offline_left = self._offline_step_cap(now)
        running = [s for s in self.running if not (self._hold_offline and s.tier is Tier.OFFLINE)]
        decoding = [s for s in running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in running if s.num_uncomputed_tokens > 1]
        decodes: list[Sequence] = []
        chunks: list[tuple[Sequence, int]] = []
        for seq in decoding:
            if budget == 0:
                break
            if self._offline_tokens(seq, 1) == 0:
                continue  # the step's offline share is spent: it decodes next step
            if seq.status is SeqStatus.RUNNING and self._grow_or_preempt(seq, 1, batch, decodes):
                decodes.append(seq)
                budget -= 1
                self._take_offline(seq, 1)
        for seq in prefilling:
            chunk = min(seq.num_uncomputed_tokens, budget, self.ledger.chunk_tokens)
            if chunk == 0:
                break
            chunk = self._offline_tokens(seq, chunk)
            if (
                chunk
                and seq.status is SeqStatus.RUNNING
                and self._grow_or_preempt(seq, chunk, batch, decodes)
            ):
                chunks.append((seq, chunk))
                budget -= chunk
                self._take_offline(seq, chunk)
        chunks = [(s, n) for s, n in chunks if s.status is SeqStatus.RUNNING]
        batch.admission_stop = self._admit(now, budget, batch, chunks)
        batch.seqs = decodes + [s for s, _ in chunks]
        batch.num_new_tokens = [1] * len(decodes) + [n for _, n in chunks]
        batch.num_decodes = len(decodes)
        return batch

    def _limit(self) -> int:
        """Sequences that may run now: max_num_seqs, slid down toward min_num_seqs as KV fills."""
        cfg = self.config
        return concurrency_limit(
            self.ledger.use_fraction,
            cfg.min_num_seqs,
            cfg.max_num_seqs,
            cfg.kv_low_watermark,
            cfg.kv_high_watermark,
        )

    def interactive_recent(self, now: float) -> bool:
        """Whether an interactive request arrived within the last INTERACTIVE_RECENT_S."""
        last = self._last_interactive_s
        return last is not None and now - last <= INTERACTIVE_RECENT_S

    def _offline_step_cap(self, now: float) -> int | None:
        """Offline tokens this step may carry; None: no cap (no recent interactive arrival)."""
        cap = self.config.offline_step_tokens
        return cap if cap is not None and self.interactive_recent(now) else None

    def _offline_tokens(self, seq: Sequence, tokens: int) -> int:
        """How many of `tokens` the step may schedule for `seq` under the offline cap."""
        if seq.tier is not Tier.OFFLINE or self._offline_left is None:
            return tokens
        return min(tokens, self._offline_left)

    def _take_offline(self, seq: Sequence, tokens: int) -> None:
        if seq.tier is Tier.OFFLINE and self._offline_left is not None:
            self._offline_left -= tokens

    def _interactive_first(self) -> bool:
        """An interactive prompt is prefilling, or the interactive head can be admitted now."""
        if any(s.tier is Tier.INTERACTIVE and s.num_uncomputed_tokens > 1 for s in self.running):
            return True
        queue = self.waiting[Tier.INTERACTIVE]
        if not queue:
            return False
        return len(self.running) < self._limit() and self._kv_admits(queue[0])

    def _kv_admits(self, seq: Sequence) -> bool:
        """Whether the KV would take `seq`'s first chunk now (the slot count aside)."""
        match = self.ledger.match(seq)
        chunk = min(self._uncached_tokens(seq, match), self.config.max_num_batched_tokens)
        return self.ledger.need(seq, match, min(chunk, self.ledger.chunk_tokens)).fits

    def _uncached_tokens(self, seq: Sequence, match: PrefixMatch) -> int:
        """Tokens a waiting `seq` still computes once its `match` is mapped."""
        return seq.num_uncomputed_tokens - match.num_tokens(self.ledger.pool.block_size_tokens)

    def _expire(self, now: float) -> list[Sequence]:
        expired: list[Sequence] = []
        for queue in self.waiting.values():
            late = [s for s in queue if s.deadline_s is not None and now > s.deadline_s]
            for seq in late:
                queue.remove(seq)
                seq.status = SeqStatus.FINISHED_TIMEOUT
                seq.finished_s = now
                seq.error = (
                    f"request {seq.request_id} waited {now - seq.arrival_s:.3f} s in the "
                    f"{seq.tier.name.lower()} queue, past its deadline of "
                    f"{seq.deadline_s - seq.arrival_s:.3f} s; the server is saturated, retry later"
                )
                expired.append(seq)
        return expired

    def _admit(
        self, now: float, budget: int, batch: ScheduledBatch, chunks: list[tuple[Sequence, int]]
    ) -> AdmissionStop:
        """Admit heads while they fit; returns the limit that stopped the pass."""
        cfg = self.config
        stop = NOTHING_WAITING
        for tier in Tier:
            queue = self.waiting[tier]
            held = self._hold_offline or self.ledger.use_fraction >= cfg.offline_idle_fraction
            if tier is Tier.OFFLINE and held:
                return AdmissionStop("offline", tier) if queue else stop
            while queue and budget > 0:
                refusal = self._head_refusal(tier, queue[0], budget)
                if isinstance(refusal, AdmissionStop):
                    return refusal  # the head waits; lower tiers may not overtake it
                seq, (match, chunk) = queue.popleft(), refusal
                self.ledger.admit(seq, match)
                granted = self.ledger.grow(seq, seq.num_computed_tokens + chunk)
                assert not isinstance(granted, Refused), "need() approved an impossible grow"
                seq.status = SeqStatus.RUNNING
                if seq.admitted_s is None:
                    seq.admitted_s = now
                    batch.admitted.append(seq)
                seq.deadline_s = None  # the deadline bounds queue wait, not generation
                self.running.append(seq)
                chunks.append((seq, chunk))
                budget -= chunk
                self._take_offline(seq, chunk)
            if queue:  # the loop ended on the token budget
                return AdmissionStop("budget", tier, queue[0].num_uncomputed_tokens, 0, "tokens")
        return stop

    def _head_refusal(
        self, tier: Tier, seq: Sequence, budget: int
    ) -> AdmissionStop | tuple[PrefixMatch, int]:
        """Why the head `seq` of `tier` cannot be admitted now, or (its prefix-cache match, its
        first chunk) when it can."""
        limit = self._limit()
        if len(self.running) >= limit:
            # Below max_num_seqs the KV watermark slid the window down: KV binds.
            reason = "ceiling" if limit >= self.config.max_num_seqs else "kv"
            return AdmissionStop(reason, tier, len(self.running) + 1, limit, "seqs")
        if tier is Tier.OFFLINE and self._num_offline() >= self._offline_cap(limit):
            return AdmissionStop("offline", tier, self._num_offline() + 1, limit, "seqs")
        if not self.ledger.slot_free(seq):
            return AdmissionStop("adapter", tier, 1, 0, "slots")
        match = self.ledger.match(seq)
        chunk = min(self._uncached_tokens(seq, match), budget, self.ledger.chunk_tokens)
        chunk = self._offline_tokens(seq, chunk)
        if chunk == 0:
            return AdmissionStop("offline", tier, 1, 0, "tokens")
        need = self.ledger.need(seq, match, chunk)
        if not need.fits:
            return AdmissionStop(
                "kv", tier, need.num_needed_blocks, need.num_available_blocks, "blocks"
            )
        return match, chunk

    def _num_offline(self) -> int:
        return sum(1 for s in self.running if s.tier is Tier.OFFLINE)

    def _offline_cap(self, limit: int) -> int:
        """Offline's share of the window: a flood of night jobs cannot take every slot, so an
        interactive request finds one free instead of waiting for a long offline job to end."""
        share = int(self.config.offline_idle_fraction * limit)
        if self._offline_left is None:
            return share
        return min(share, max(1, self.config.offline_step_tokens // 2))

    # ----- preemption ----------------------------------------------------------------------
    def _yield_offline_slot(self, batch: ScheduledBatch) -> None:
        """An interactive request waiting for a slot takes one from the newest offline sequence,
        which is recomputed later: a flood of offline work must not make an interactive prompt
        wait for a long offline job to end (R5), and the replica's admission counts offline
        slots as free for interactive work (serving/llm/ttft.py)."""
        queue = self.waiting[Tier.INTERACTIVE]
        if not queue or len(self.running) < self._limit():
            return
        if not self._kv_admits(queue[0]):
            return  # KV, not the slot, holds it back: freeing a slot would only churn
        offline = [s for s in self.running if s.tier is Tier.OFFLINE]
        if offline:
            self._preempt(max(offline, key=lambda s: s.arrival_s), batch)

    # ----- preemption for KV (on_demand only) ----------------------------------------------
    def _grow_or_preempt(
        self, seq: Sequence, num_new: int, batch: ScheduledBatch, decodes: list[Sequence]
    ) -> bool:
        """Make room for `num_new` more tokens of `seq`; False if `seq` itself was preempted."""
        target = seq.num_computed_tokens + num_new
        while isinstance(self.ledger.grow(seq, target), Refused):
            if self.ledger.mode == "reserve":
                raise AssertionError(f"{seq.request_id} outgrew its reservation")
            victim = max(self.running, key=lambda s: (s.tier, s.arrival_s))
            self._preempt(victim, batch)
            if victim in decodes:
                decodes.remove(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        """Recompute later: drop its KV, keep its tokens, put it at the head of its queue."""
        self.running.remove(seq)
        self.ledger.release(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting[seq.tier].appendleft(seq)
        batch.preempted.append(seq)

    # ----- postprocess -----------------------------------------------------------------------
    def postprocess(self, batch: ScheduledBatch, sampled: list[int], now: float) -> list[Sequence]:
        """Advance every scheduled sequence; returns those that produced a token."""
        advanced: list[Sequence] = []
        it = iter(sampled)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.ledger.commit(seq)  # its KV up to num_computed_tokens is written now
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk that did not reach the end of the prompt
            token = next(it)
            seq.token_ids.append(token)
            if seq.first_token_s is None:
                seq.first_token_s = now
            stop = seq.stop_reason_after(token)
            if stop is not None:
                self.finish(seq, stop, now)
            advanced.append(seq)
        return advanced
