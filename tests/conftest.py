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
    from serving.tiny_models import tiny_tokenizer

    return tiny_tokenizer()


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 200, vocab: int = 512):
    """n prompts of lo..hi random token ids (ids >= 3 so no special token appears)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def hf_greedy(model, prompts, max_new_tokens) -> list[list[int]]:
    """transformers' own greedy continuation of each prompt (one `generate` per prompt, no
    padding): the reference every engine equality test compares with. `max_new_tokens` is one
    count for all or one per prompt."""
    counts = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    refs = []
    for prompt, n in zip(prompts, counts, strict=True):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
        refs.append(out[0, len(prompt) :].tolist())
    return refs


def engine_stats(**overrides):
    """A hand-built EngineStats for tests of code that reads one (routing, metrics)."""
    from serving.engine import EngineStats

    fields = {
        "running_by_tier": {"interactive": 3, "offline": 1},
        "waiting_by_tier": {"interactive": 2},
        "num_kv_blocks_total": 100,
        "num_kv_blocks_used": 30,
        "num_kv_blocks_reserved": 45,
        "block_size_tokens": 16,
        "concurrency_limit": 8,
        "tokens_per_s": 123.0,
        "queue_wait_p50_s": 0.01,
        "queue_wait_p99_s": 0.2,
        "num_preemptions": 0,
        "num_finished": 7,
        "num_timeouts": 0,
    }
    fields.update(overrides)
    return EngineStats(**fields)
