"""Shared fixtures. Nothing here touches the network: models are built from configs."""

from __future__ import annotations

import os
import random

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

torch.set_num_threads(1)


class FakeClock:
    """A clock the test moves by hand: `clock()` reads it, `clock.advance(s)` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def tokenizer():
    from serving.testing import tiny_tokenizer

    return tiny_tokenizer()


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 200, vocab: int = 512):
    """n prompts of lo..hi random token ids (ids >= 3 so no special token appears)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
