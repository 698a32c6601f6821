"""Runners: turn a ScheduledBatch into one next token per sampling sequence.

PagedRunner  one packed forward per step over the paged cache (any model on the attention interface)
HFRunner     the plain fallback: one HF forward per sequence with its own DynamicCache
"""

from __future__ import annotations

import inspect
import time
from typing import Protocol

import torch

from serving.engine import attention
from serving.engine.attention import DecodeGroup, PagedMetadata, PrefillSegment
from serving.engine.cpu_attention import probe_native
from serving.engine.flex_decode import probe_flex, resolve_decode_attention
from serving.engine.kv_blocks import BlockPool
from serving.engine.lean_forward import LeanForward, supports
from serving.engine.sampler import sample
from serving.engine.scheduler import ScheduledBatch
from serving.engine.sequence import Sequence


class Runner(Protocol):
    """Runs a batch; returns the sampled token of every row where `batch.samples(i)`, in order."""

    last_forward_s: float

    def run(self, batch: ScheduledBatch) -> list[int]: ...

    def release(self, request_id: str) -> None:
        """Forget per-sequence state of a finished or aborted request."""
        ...


def group_by_length(ctx_desc: list[int], max_groups: int = 4, min_size: int = 4):
    """Split decodes (context lengths, longest first) into row ranges that pad little.

    A new group starts where a context is at most half the group's longest, so padding wastes
    under half of any group's gather; small groups and many SDPA calls cost more than they save.
    """
    groups: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(ctx_desc)):
        if (
            len(groups) < max_groups - 1
            and i - start >= min_size
            and len(ctx_desc) - i >= min_size
            and 2 * ctx_desc[i] <= ctx_desc[start]
        ):
            groups.append((start, i))
            start = i
    if ctx_desc:
        groups.append((start, len(ctx_desc)))
    return groups


def to_device(values: list[int], device: torch.device, dtype=torch.long) -> torch.Tensor:
    """Step metadata onto the device. On CUDA through pinned host memory with a non-blocking
    copy: the host goes on building the step instead of waiting for each small transfer (a copy
    from pageable memory blocks the host). On CPU the tensor is simply made."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class ForwardTimer:
    """The forward's duration without a per-step torch.cuda.synchronize(): on CUDA two events
    are recorded around it and read after the sampler's device->host copy, which has waited for
    the forward anyway. On CPU the forward is synchronous: wall time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t0 = 0.0
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def begin(self) -> None:
        if self.cuda:
            self.start.record()
        self.t0 = time.perf_counter()

    def stop(self) -> float | None:
        """Wall seconds on CPU; None on CUDA (read with elapsed_s once the step has synced)."""
        if self.cuda:
            self.end.record()
            return None
        return time.perf_counter() - self.t0

    def elapsed_s(self) -> float:
        self.end.synchronize()  # already complete: the sampler's copy waited for it
        return self.start.elapsed_time(self.end) / 1000.0


def _rows_of(batch: ScheduledBatch, rows: list[int]) -> list[Sequence]:
    return [batch.seqs[i] for i in rows]


class PagedRunner:
    def __init__(
        self,
        model,
        kv_cache: torch.Tensor,
        pool: BlockPool,
        decode_attention: str = "gather",
        lean_forward: bool = True,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.pool = pool
        self.block_size = pool.block_size_tokens
        self.device = kv_cache.device
        self.decode_attention = resolve_decode_attention(
            decode_attention,
            self.device,
            lambda: self._probe_flex(model),
            lambda: self._probe_native(model),
        )
        self.last_forward_s = 0.0
        self.adapters = None  # LoraManager when the engine serves adapters (serving/engine/lora/)
        model.set_attn_implementation(attention.register())
        # Llama-family models skip transformers' plumbing (serving/engine/lean_forward.py);
        # built after packing and LoRA wrapping, so it calls the modules that serve.
        self.lean = LeanForward(model) if lean_forward and supports(model) else None

    def _attention_shapes(self, model) -> tuple[torch.dtype, int, int, int, int]:
        """(KV dtype, heads, kv heads, head dim, block size): what a decode path's check runs on."""
        layer = self.kv_cache[0]  # [2, kv_heads, blocks + 1, block_size, head_dim]
        heads = model.config.get_text_config().num_attention_heads
        return layer.dtype, heads, layer.shape[1], layer.shape[-1], self.block_size

    def _probe_flex(self, model) -> str | None:
        return probe_flex(self.device, *self._attention_shapes(model))

    def _probe_native(self, model) -> str | None:
        return probe_native(*self._attention_shapes(model))

    def release(self, request_id: str) -> None:
        pass  # all state is in the block pool, which the scheduler frees

    def _slots(self, table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def _decode_group(self, seqs: list[Sequence], start: int) -> DecodeGroup:
        bs, dev, tables = self.block_size, self.device, self.pool.tables()
        ctx = [s.num_computed_tokens + 1 for s in seqs]
        num_blocks = -(-max(ctx) // bs)
        padded: list[int] = []
        for s in seqs:  # pad with block 0: its keys are masked out
            t = tables[s.request_id][:num_blocks]
            padded.extend(t)
            padded.extend([0] * (num_blocks - len(t)))
        lens = to_device(ctx, dev)
        mask = torch.arange(num_blocks * bs, device=dev).unsqueeze(0) < lens.unsqueeze(1)
        return DecodeGroup(
            start=start,
            end=start + len(seqs),
            blocks=to_device(padded, dev),
            mask=mask.view(1, len(seqs), 1, num_blocks * bs),
            lens=lens,
        )

    def _prefill_segment(self, table: list[int], row: int, c: int, n: int) -> PrefillSegment:
        seg = PrefillSegment(row, row + n, first_position=c)
        if c > 0:  # chunked prefill or recompute: attend to the cached context as well
            dev, nb = self.device, -(-(c + n) // self.block_size)
            seg.context_blocks = to_device(table[:nb], dev)
            q_pos = torch.arange(c, c + n, device=dev).unsqueeze(1)
            seg.mask = torch.arange(nb * self.block_size, device=dev).unsqueeze(0) <= q_pos
        return seg

    def _prepare(self, batch: ScheduledBatch):
        """Pack the batch: decodes longest-context first, in groups, then prefill chunks.

        Returns the packed ids and positions, the attention metadata, and for each row that
        samples, the index of its sequence in `batch` (rows are reordered, the batch is not).
        """
        tables = self.pool.tables()
        nd = batch.num_decodes
        order = sorted(range(nd), key=lambda i: -batch.seqs[i].num_computed_tokens)
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        segments: list[PrefillSegment] = []
        sample_rows: list[int] = []
        sampled_from: list[int] = []
        packed = order + list(range(nd, len(batch.seqs)))
        if self.adapters is not None:  # each packed row's adapter slot
            self.adapters.begin_step((batch.seqs[i], batch.num_new_tokens[i]) for i in packed)
        for i in packed:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            c = seq.num_computed_tokens
            row = len(ids)
            table = tables[seq.request_id]
            ids.extend(seq.token_ids[c : c + n])
            pos.extend(range(c, c + n))
            slots.extend(self._slots(table, c, c + n))
            if i >= nd:
                segments.append(self._prefill_segment(table, row, c, n))
            if c + n == seq.num_tokens:
                sample_rows.append(row + n - 1)
                sampled_from.append(i)
        meta = PagedMetadata(
            kv_cache=self.kv_cache,
            slot_mapping=to_device(slots, self.device),
            prefills=segments,
            decode_attention=self.decode_attention,
        )
        decodes = [batch.seqs[i] for i in order]
        for start, end in group_by_length([s.num_computed_tokens + 1 for s in decodes]):
            meta.decode_groups.append(self._decode_group(decodes[start:end], start))
        return ids, pos, meta, sample_rows, sampled_from

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        ids, pos, meta, sample_rows, sampled_from = self._prepare(batch)
        dev = self.device
        timer = ForwardTimer(dev)
        timer.begin()
        ids_t, pos_t, keep = to_device(ids, dev), to_device(pos, dev), to_device(sample_rows, dev)
        if self.lean is not None:
            logits = self.lean(ids_t, pos_t, meta, keep)
        else:
            out = self.model(
                input_ids=ids_t.unsqueeze(0),
                position_ids=pos_t.unsqueeze(0),
                use_cache=False,
                paged=meta,
                logits_to_keep=keep,
            )
            logits = out.logits[0]
        wall_s = timer.stop()
        tokens = sample(logits, _rows_of(batch, sampled_from))  # the step's one sync point
        self.last_forward_s = timer.elapsed_s() if wall_s is None else wall_s
        by_seq = dict(zip(sampled_from, tokens, strict=True))
        return [by_seq[i] for i in sorted(by_seq)]


class HFRunner:
    """Fallback for models without attention-interface support: per-sequence HF forward."""

    def __init__(self, model, device: torch.device) -> None:
        from transformers import DynamicCache

        self.model = model
        self.device = device
        self.last_forward_s = 0.0
        self.adapters = None  # LoraManager when the engine serves adapters (serving/engine/lora/)
        self._new_cache = lambda: DynamicCache(config=model.config)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._caches: dict[str, object] = {}

    def release(self, request_id: str) -> None:
        self._caches.pop(request_id, None)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        rows: list[int] = []
        logits: list[torch.Tensor] = []
        t0 = time.perf_counter()
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            c = seq.num_computed_tokens
            if c == 0:  # new, or preempted and recomputing: start from an empty cache
                self._caches[seq.request_id] = self._new_cache()
            if self.adapters is not None:
                self.adapters.begin_step([(seq, n)])
            out = self.model(
                input_ids=torch.tensor([seq.token_ids[c : c + n]], device=self.device),
                position_ids=torch.arange(c, c + n, device=self.device).unsqueeze(0),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: self._caches[seq.request_id]},
            )
            if batch.samples(i):
                rows.append(i)
                logits.append(out.logits[0, -1])
        self.last_forward_s = time.perf_counter() - t0
        if not rows:
            return []
        return sample(torch.stack(logits), _rows_of(batch, rows))
