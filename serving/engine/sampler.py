"""The batched sampler: every row of a step in a few tensor ops and ONE device->host copy.

Order of the steps (each touches only the rows that ask for it, so a plain greedy row stays
bit-identical to argmax of the model's logits):
  1. logprobs of the model's own distribution (before any processing, like vLLM's default);
  2. penalties: repetition (prompt + output), then frequency and presence (output, OpenAI's);
  3. logit_bias; 4. the grammar mask of constrained rows (disallowed tokens get -inf);
  5. greedy rows: argmax; sampled rows: temperature, min_p, top_k, top_p, then one draw by the
     exponential race (argmax of p / E, E ~ Exp(1)), which samples exactly from p. Seeded rows
     draw E from their own generator, so the same seed gives the same text whatever else runs.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from serving.engine.outputs import TokenLogprob
from serving.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from serving.engine.sequence import Sequence


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private generator for seeded sampled requests: the same seed gives the same text."""
    if params.greedy or params.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen


def _rows(seqs: Seq[Sequence], want) -> list[int]:
    return [i for i, s in enumerate(seqs) if want(s)]


def _token_table(lists: list[list[int]], pad: int, device) -> torch.Tensor:
    width = max(1, max(len(x) for x in lists))
    return torch.tensor([x + [pad] * (width - len(x)) for x in lists], device=device)


def apply_penalties(logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
    """In place on logits[rows]; counts are rebuilt from the token lists (no state to drift)."""
    vocab, dev = logits.shape[1], logits.device
    sub = logits[rows]
    params = [seqs[i].params for i in rows]
    outputs = _token_table([seqs[i].output_token_ids for i in rows], vocab, dev)
    counts = torch.zeros(len(rows), vocab + 1, device=dev)
    counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=counts.dtype))
    counts = counts[:, :vocab]
    rep = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in rep):
        prompts = [seqs[i].token_ids[: seqs[i].num_prompt_tokens] for i in rows]
        prompts = _token_table(prompts, vocab, dev)
        seen = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=dev)
        seen.scatter_(1, prompts, True)
        seen = seen[:, :vocab] | (counts > 0)
        r = torch.tensor(rep, device=dev).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / r, sub * r), sub)
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params], device=dev).unsqueeze(1)
    sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
    logits[rows] = sub


def apply_logit_bias(logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
    r_idx, t_idx, vals = [], [], []
    for i in rows:
        for tok, bias in seqs[i].params.logit_bias:
            r_idx.append(i)
            t_idx.append(tok)
            vals.append(bias)
    dev = logits.device
    index = (torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev))
    logits.index_put_(index, torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def grammar_allowed(seqs: Seq[Sequence], rows: list[int], vocab: int, device) -> torch.Tensor:
    """Boolean [len(rows), vocab] of allowed tokens. The matchers fill one int32 bitmask on the
    CPU (bit j of word w allows token 32w + j); it is unpacked where the logits are."""
    # All bits set = all allowed; each matcher writes its row in place (llguidance.torch's
    # helper does the same, but importing it compiles a kernel we do not use).
    bitmask = torch.full((len(rows), (vocab + 31) // 32), -1, dtype=torch.int32)
    broken: list[tuple[int, list[int]]] = []
    for k, i in enumerate(rows):
        matcher = seqs[i].matcher
        if matcher.is_error():  # cannot happen for masked tokens; end the output, never hang
            broken.append((k, sorted(seqs[i].eos_token_ids)))
        else:
            row = bitmask[k]
            matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    bits = (bitmask.to(device, non_blocking=True).unsqueeze(-1) >> shifts) & 1
    allowed = bits.view(len(rows), -1)[:, :vocab].bool()
    for k, eos in broken:
        allowed[k] = False
        allowed[k, eos] = True
    return allowed


def apply_grammar(logits: torch.Tensor, seqs: Seq[Sequence], rows: list[int]) -> None:
    index = torch.tensor(rows, device=logits.device)
    allowed = grammar_allowed(seqs, rows, logits.shape[1], logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p on the sampled rows; returns probabilities."""
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev).unsqueeze(1)
    logits = logits / temps
    if any(p.min_p > 0 for p in params):
        probs = torch.softmax(logits, dim=-1)
        floor = torch.tensor([p.min_p for p in params], device=dev).unsqueeze(1)
        logits = logits.masked_fill(probs < floor * probs.amax(-1, keepdim=True), float("-inf"))
    if any(p.top_k for p in params) or any(p.top_p < 1.0 for p in params):
        vocab = logits.shape[1]
        ranked, order = logits.sort(dim=-1, descending=True)
        k = torch.tensor([p.top_k or vocab for p in params], device=dev).unsqueeze(1)
        ranked = ranked.masked_fill(torch.arange(vocab, device=dev) >= k, float("-inf"))
        sorted_probs = torch.softmax(ranked, dim=-1)
        top_p = torch.tensor([p.top_p for p in params], device=dev).unsqueeze(1)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        ranked = ranked.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, ranked)
    return torch.softmax(logits, dim=-1)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    noise = torch.empty_like(probs)
    if any(g is None for g in generators):
        noise.exponential_()
    for i, gen in enumerate(generators):
        if gen is not None:
            noise[i].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)


def _choose(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    tokens = logits.argmax(dim=-1)
    rows = _rows(seqs, lambda s: not s.params.greedy)
    if rows:
        index = torch.tensor(rows, device=logits.device)
        probs = _filter(logits[index].float(), [seqs[i].params for i in rows])
        tokens[index] = _draw(probs, [seqs[i].generator for i in rows])
    return tokens


def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, seqs, rows: list[int]) -> torch.Tensor:
    """Per row in `rows`: [chosen logprob, top ids..., top logprobs...] (float64, exact ids)."""
    index = torch.tensor(rows, device=raw.device)
    lp = torch.log_softmax(raw[index].float(), dim=-1)
    chosen = lp.gather(1, tokens[index].unsqueeze(1))
    k = max(seqs[i].params.logprobs for i in rows)
    top = lp.topk(k, dim=-1) if k else None
    parts = [chosen.double()]
    if top is not None:
        parts += [top.indices.double(), top.values.double()]
    return torch.cat(parts, dim=1)


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """One next token per row of `logits` [rows, vocab]; row i belongs to seqs[i].

    Records logprobs on the sequences that asked and advances their grammars."""
    raw = logits
    processed = any(
        s.params.penalized or s.params.logit_bias or s.matcher is not None for s in seqs
    )
    if processed:  # in float32, on a copy: logprobs read the unprocessed logits
        logits = logits.float()
        if logits.data_ptr() == raw.data_ptr():
            logits = logits.clone()
    # Otherwise greedy rows take argmax of the model's own logits in their own dtype: widening
    # to float32 keeps every value and so the argmax, and copying a [rows, vocab] half-precision
    # matrix cost 4.4 ms of a 54 ms CPU decode step (16 rows, 49k vocab); sampled rows widen
    # their own rows only.
    if rows := _rows(seqs, lambda s: s.params.penalized):
        apply_penalties(logits, seqs, rows)
    if rows := _rows(seqs, lambda s: bool(s.params.logit_bias)):
        apply_logit_bias(logits, seqs, rows)
    if rows := _rows(seqs, lambda s: s.matcher is not None):
        apply_grammar(logits, seqs, rows)
    tokens = _choose(logits, seqs)
    lp_rows = _rows(seqs, lambda s: s.params.logprobs is not None)
    if not lp_rows:
        ids = tokens.tolist()  # the step's one device->host copy
    else:
        packed = _logprobs(raw, tokens, seqs, lp_rows)
        both = torch.cat([tokens.double(), packed.flatten()]).tolist()  # still one copy
        ids = [int(t) for t in both[: len(seqs)]]
        _record_logprobs(seqs, lp_rows, ids, both[len(seqs) :], packed.shape[1])
    for i, seq in enumerate(seqs):
        if seq.matcher is not None:
            seq.matcher.consume_token(ids[i])
    return ids


def _record_logprobs(seqs, rows: list[int], ids: list[int], flat: list[float], width: int):
    k_max = (width - 1) // 2
    for n, i in enumerate(rows):
        row = flat[n * width : (n + 1) * width]
        k = seqs[i].params.logprobs
        top = tuple((int(row[1 + j]), row[1 + k_max + j]) for j in range(k))
        seqs[i].logprobs.append(TokenLogprob(ids[i], row[0], top))
