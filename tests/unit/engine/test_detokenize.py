"""Incremental detokenization equals decoding everything at once, split UTF-8 included."""

from __future__ import annotations

import random

import pytest

from serving.engine.detokenize import IncrementalDetokenizer


def decode_fn(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "text",
    [
        "def main():\n    return {'a': 1}  # done",
        "naïve café — 東京 🚀🎉 spaces   and\ttabs",
        "ü",
    ],
)
def test_token_by_token_text_equals_full_decode(tokenizer, text):
    ids = tokenizer(text).input_ids
    detok = IncrementalDetokenizer(decode_fn(tokenizer))
    pieces = [detok.step(ids[: i + 1], final=i == len(ids) - 1) for i in range(len(ids))]
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)  # split characters were held back


def test_random_token_streams_match_full_decode(tokenizer):
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(3, tokenizer.vocab_size) for _ in range(rng.randint(1, 60))]
        detok = IncrementalDetokenizer(decode_fn(tokenizer))
        out = "".join(detok.step(ids[: i + 1], final=i == len(ids) - 1) for i in range(len(ids)))
        assert out == tokenizer.decode(ids, skip_special_tokens=True)


def test_each_step_decodes_a_short_window():
    seen: list[int] = []

    def decode(ids):
        seen.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    detok = IncrementalDetokenizer(decode)
    ids: list[int] = []
    for i in range(200):
        ids.append(i)
        detok.step(ids, final=False)
    assert max(seen) <= 2  # never the whole output
