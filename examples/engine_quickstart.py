"""The engine on its own: batch generation, a stream, and the KV ledger's view of it.

.venv/bin/python examples/engine_quickstart.py                 # tiny random model, offline
.venv/bin/python examples/engine_quickstart.py --model DIR     # any local HF model directory
"""

from __future__ import annotations

import argparse
import asyncio

import torch

from serving.engine import EngineConfig, LLMEngine, SamplingParams


def build(model_dir: str | None, kv_mode: str) -> LLMEngine:
    config = EngineConfig(kv_mode=kv_mode, max_num_seqs=32, min_num_seqs=8)
    if model_dir:
        return LLMEngine.from_pretrained(model_dir, config)
    from serving.tiny_models import tiny_model, tiny_tokenizer

    return LLMEngine(tiny_model("qwen2"), tiny_tokenizer(), config)


async def stream_one(engine: LLMEngine, prompt: str) -> None:
    print(f"\nstreaming {prompt!r}:")
    async for delta in engine.stream(
        prompt, SamplingParams(max_tokens=24, temperature=0.7, seed=1)
    ):
        print(delta.text, end="", flush=True)
    print(f"\n[{delta.finish_reason}, {delta.num_output_tokens} tokens]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="local model directory (default: tiny random model)")
    parser.add_argument("--kv-mode", default="reserve", choices=["reserve", "on_demand"])
    args = parser.parse_args()
    torch.set_num_threads(2)
    engine = build(args.model, args.kv_mode)
    print(
        f"KV cache: {engine.pool.num_blocks} blocks x {engine.pool.block_size_tokens} tokens, "
        f"max_model_len {engine.max_model_len}, mode {engine.config.kv_mode}"
    )
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(max_tokens=32, temperature=0)
    for out in engine.generate(prompts, params):
        print(
            f"\n{out.request_id} [{out.finish_reason}, {len(out.token_ids)} tokens, "
            f"ttft {out.ttft_s * 1000:.1f} ms, total {out.latency_s * 1000:.1f} ms]"
        )
        print(f"  {out.text!r}")
    asyncio.run(stream_one(engine, "Hello"))
    stats = engine.stats()
    print(
        f"\nstats: finished={stats.num_finished} kv_used={stats.num_kv_blocks_used} "
        f"kv_reserved={stats.num_kv_blocks_reserved} queue_wait_p99={stats.queue_wait_p99_s:.4f}s"
    )


if __name__ == "__main__":
    main()
