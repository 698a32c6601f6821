"""The batched sampler (serving/engine/sampler.py): every control, checked against its formula."""

from __future__ import annotations

import math

import pytest
import torch

from common.tiers import Tier
from serving.engine.sampler import make_generator, sample
from serving.engine.sampling_params import SamplingParams
from serving.engine.sequence import RequestId, Sequence

VOCAB = 64


def seq(params: SamplingParams, prompt=(1, 2, 3), output=(), sid: int = 0) -> Sequence:
    s = Sequence(
        request_id=RequestId(f"r{sid}"),
        token_ids=list(prompt),
        params=params,
        tier=Tier.INTERACTIVE,
        arrival_s=0.0,
        deadline_s=None,
        eos_token_ids=frozenset({0}),
        max_total_tokens=1000,
        generator=make_generator(params, torch.device("cpu")),
    )
    s.token_ids.extend(output)
    return s


def logits_rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_argmax_bit_for_bit_beside_sampled_rows():
    logits = logits_rows(6)
    greedy = SamplingParams(temperature=0)
    params = [greedy, SamplingParams(temperature=1.0, top_p=0.5, seed=1)] * 3
    out = sample(logits, [seq(p, sid=i) for i, p in enumerate(params)])
    expect = logits.argmax(-1).tolist()
    assert [out[i] for i in (0, 2, 4)] == [expect[i] for i in (0, 2, 4)]
    bf16 = logits.to(torch.bfloat16)  # the model's dtype: argmax of the raw rows, not a copy
    assert sample(bf16, [seq(greedy, sid=i) for i in range(6)]) == bf16.argmax(-1).tolist()
    # A mixed half-precision batch picks what its float32 widening picks, seeded draws included.
    mixed = sample(bf16, [seq(p, sid=i) for i, p in enumerate(params)])
    assert mixed == sample(bf16.float(), [seq(p, sid=i) for i, p in enumerate(params)])


def test_seeded_rows_repeat_whatever_else_is_in_the_batch():
    logits = logits_rows(4) / 6  # flat enough that draws vary
    params = SamplingParams(temperature=1.0, seed=42)

    def run(rows: list[int]) -> list[int]:
        seqs = [
            seq(params, sid=i) if i == 0 else seq(SamplingParams(temperature=1.0)) for i in rows
        ]
        got = []
        for _ in range(5):  # one generator per sequence, advanced step by step
            got.append(sample(logits[rows], seqs)[0])
        return got

    alone = run([0])
    assert run([0, 1, 2, 3]) == alone
    seven = seq(SamplingParams(temperature=1.0, seed=7))
    other = [sample(logits[:1], [seven])[0] for _ in range(5)]
    assert other != alone  # a different seed gives a different draw (64-way, 5 steps)


def test_draws_follow_the_filtered_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4)]))
    n = 4000
    counts = torch.zeros(VOCAB)
    params = SamplingParams(temperature=1.0, seed=3)
    s = seq(params)
    batch = logits.expand(n, -1).contiguous()
    # n rows of one unseeded request each: a single batched draw
    toks = sample(batch, [seq(SamplingParams(temperature=1.0), sid=i) for i in range(n)])
    for t in toks:
        counts[t] += 1
    assert abs(counts[0] / n - 0.5) < 0.03 and abs(counts[1] / n - 0.3) < 0.03
    assert counts[4:].sum() == 0
    # top_p=0.7: only the first two tokens (0.5 + 0.3 reaches it), renormalised 5:3
    cut = [sample(logits, [seq(SamplingParams(top_p=0.7, seed=i))])[0] for i in range(300)]
    assert set(cut) <= {0, 1} and 0.5 < cut.count(0) / 300 < 0.75
    assert {sample(logits, [seq(SamplingParams(top_k=1, seed=i))])[0] for i in range(20)} == {0}
    # min_p=0.4: tokens below 0.4 * 0.5 = 0.2 drop out (0.15, 0.05)
    mp = {sample(logits, [seq(SamplingParams(min_p=0.4, seed=i))])[0] for i in range(200)}
    assert mp == {0, 1}
    assert s.generator is not None


def test_penalties_follow_openai_and_hf_formulas():
    logits = logits_rows(1)
    out = (5, 5, 9)
    p = SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=0.25)
    expect = logits.clone()
    expect[0, 5] -= 0.5 * 2 + 0.25
    expect[0, 9] -= 0.5 * 1 + 0.25
    assert sample(logits, [seq(p, output=out)]) == expect.argmax(-1).tolist()
    # Make the effect decisive: boost token 5, then a frequency penalty must move off it.
    boosted = logits.clone()
    boosted[0, 5] = boosted.max() + 1.0
    assert sample(boosted, [seq(SamplingParams(temperature=0), output=out)]) == [5]
    fp = SamplingParams(temperature=0, frequency_penalty=2.0)
    assert sample(boosted, [seq(fp, output=out)]) != [5]
    # repetition: seen tokens (prompt 1,2,3 and output) divided if positive, multiplied if not
    rep = SamplingParams(temperature=0, repetition_penalty=1.5, logprobs=None)
    x = torch.zeros(1, VOCAB)
    x[0, 1], x[0, 2], x[0, 7] = 3.0, -1.0, 2.5
    assert sample(x, [seq(rep)]) == [7]  # 3.0 / 1.5 = 2.0 < 2.5
    assert sample(x, [seq(SamplingParams(temperature=0))]) == [1]


def test_logit_bias_moves_the_argmax_and_is_batched_per_row():
    logits = logits_rows(2)
    target = int(logits[0].argmin())
    biased = SamplingParams(temperature=0, logit_bias=((target, 100.0),))
    plain = SamplingParams(temperature=0)
    got = sample(logits, [seq(biased), seq(plain, sid=1)])
    assert got == [target, int(logits[1].argmax())]
    ban = SamplingParams(temperature=0, logit_bias=((int(logits[0].argmax()), -100.0),))
    assert sample(logits[:1], [seq(ban)]) == [int(logits[0].topk(2).indices[1])]


def test_logprobs_are_the_models_own_and_ranked():
    logits = logits_rows(3)
    s = [
        seq(SamplingParams(temperature=0, logprobs=3)),
        seq(SamplingParams(temperature=1.0, seed=5), sid=1),
        seq(SamplingParams(temperature=1.0, seed=5, logprobs=0), sid=2),
    ]
    toks = sample(logits, s)
    lp = torch.log_softmax(logits, -1)
    (first,) = s[0].logprobs
    assert first.token_id == toks[0] and math.isclose(first.logprob, lp[0, toks[0]], abs_tol=1e-5)
    assert [t for t, _ in first.top] == lp[0].topk(3).indices.tolist()
    assert s[1].logprobs == [] and len(s[2].logprobs) == 1 and s[2].logprobs[0].top == ()
    assert math.isclose(s[2].logprobs[0].logprob, lp[2, toks[2]], abs_tol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"logit_bias": ((3, 101.0),)}, r"logit_bias\[3\]"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_new_sampling_params_are_range_checked(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(**kwargs)


def test_one_device_to_host_copy_per_step(monkeypatch):
    """Every kind of row in one batch: the only copies to the host are one tolist()."""
    calls = {"tolist": 0, "item": 0, "cpu": 0}
    for name in calls:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **kw):
            calls[_name] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, seed=1, top_p=0.9, top_k=20, min_p=0.05),
        SamplingParams(temperature=1.0, presence_penalty=1.0, repetition_penalty=1.2),
        SamplingParams(temperature=0, logit_bias=((3, 5.0),), logprobs=4),
        SamplingParams(temperature=1.2, frequency_penalty=0.5, logprobs=0),
    ]
    seqs = [seq(p, output=(4, 5, 4), sid=i) for i, p in enumerate(params)]
    sample(logits_rows(len(params)), seqs)
    assert calls == {"tolist": 1, "item": 0, "cpu": 0}
