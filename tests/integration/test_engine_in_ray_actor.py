"""The engine inside a Ray actor, as a Serve replica will hold it: built there, streamed out.

The engine never imports Ray; this checks that it runs unchanged in a Ray worker process (its own
asyncio loop, a worker thread for steps) and that what comes out equals a local run.
"""

from __future__ import annotations

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.tiny_models import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

PROMPTS = ["def main():", "import json", "class Foo(object):", "return x"]
PARAMS = SamplingParams(max_tokens=12, temperature=0)
CONFIG = EngineConfig(num_kv_blocks=64, block_size_tokens=8, max_model_len=256)


class EngineActor:
    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        self.engine = LLMEngine(tiny_model("qwen2", seed=4), tiny_tokenizer(), CONFIG)

    async def generate(self, prompt: str, tier: str) -> tuple[list[int], str, list[int]]:
        ids, text, sizes = [], "", []
        async for delta in self.engine.stream(prompt, PARAMS, tier=tier):
            ids += delta.token_ids
            text += delta.text
            sizes.append(len(delta.token_ids))
        return ids, text, sizes

    def stats(self) -> dict:
        s = self.engine.stats()
        return {
            "used": s.num_kv_blocks_used,
            "reserved": s.num_kv_blocks_reserved,
            "finished": s.num_finished,
            "alive": self.engine.loop_alive,
        }


def test_engine_streams_from_a_ray_actor_and_matches_a_local_run(ray_cluster):
    ray = ray_cluster
    actor = ray.remote(num_cpus=0)(EngineActor).remote()
    tiers = ["interactive", "analytical", "offline", "interactive"]
    remote = ray.get(
        [actor.generate.remote(p, t) for p, t in zip(PROMPTS, tiers, strict=True)], timeout=120
    )
    local = LLMEngine(tiny_model("qwen2", seed=4), tiny_tokenizer(), CONFIG).generate(
        PROMPTS, PARAMS
    )
    for (ids, text, sizes), out in zip(remote, local, strict=True):
        assert ids == out.token_ids
        assert text == out.text
        # Streamed, not batched up: the first token alone (TTFT), the rest in later deltas (one
        # per step, or merged when this consumer fell behind the engine: serving/engine/driver.py)
        assert sizes[0] == 1 and len(sizes) >= 2
    stats = ray.get(actor.stats.remote(), timeout=30)
    assert stats == {"used": 0, "reserved": 0, "finished": 4, "alive": True}
    ray.kill(actor)
