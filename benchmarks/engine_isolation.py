"""Tier isolation at the engine level (no Ray, no HTTP): interactive TTFT with the engine idle vs
under a flood of offline work ten times the interactive request count.

    python benchmarks/engine_isolation.py [--quick] [--json PATH] [--config cluster.yaml]
        [--interactive N] [--flood-factor 10] [--model embedded|tiny]

One engine, the config's engine section and torch_threads (the default job's replica). An
interactive client sends N chat requests one after another (max 32 tokens each, 0.2 s apart),
measuring each request's TTFT (submit -> first delta); once alone, once while flood-factor x N
offline requests (96 tokens each) were all submitted at the start. The offline tier is admitted
only on idle capacity (engine.offline_idle_fraction), interactive work is admitted first, a
step carries at most engine.offline_step_tokens offline tokens while interactive requests arrive,
and offline-only steps then take at most engine.offline_duty_fraction of the engine's time;
target: loaded interactive TTFT p50 <= 1.2 x unloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _common as c
from benchmarks.engine_embedded import encode
from benchmarks.peer_http import chat_prompts

TARGET = 1.2
GAP_S = 0.2


async def interactive(engine, prompts, max_tokens: int) -> list[float]:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    ttfts = []
    for p in prompts:
        t0 = time.perf_counter()
        first = None
        async for d in engine.stream(p, params, tier="interactive"):
            if first is None and d.token_ids:
                first = time.perf_counter() - t0
        ttfts.append(first)
        await asyncio.sleep(GAP_S)
    return ttfts


async def offline_one(engine, prompt) -> int:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=96, temperature=0, ignore_eos=True)
    n = 0
    async for d in engine.stream(prompt, params, tier="offline"):
        n += len(d.token_ids)
    return n


async def loaded(engine, prompts, flood, max_tokens: int) -> tuple[list[float], dict]:
    tasks = [asyncio.create_task(offline_one(engine, p)) for p in flood]
    await asyncio.sleep(0.5)  # the flood is queued and its first requests are running
    st = engine.stats()
    during = {"offline_running": st.num_running, "waiting": st.num_waiting}
    ttfts = await interactive(engine, prompts, max_tokens)
    done = sum(t.done() for t in tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _ in range(200):  # aborted streams free their KV at the next steps
        if not engine.has_unfinished():
            break
        await asyncio.sleep(0.01)
    return ttfts, {**during, "offline_finished_during_run": done}


def load_engine(args):
    import torch

    from serving.config.app_config import load_cluster_yaml
    from serving.engine import LLMEngine, torch_thread
    from serving.model_source import resolve_model_dir

    cfg = load_cluster_yaml(args.config)
    rep = cfg.replica  # the replica's threads (`auto` resolved for this node, pinning aside)
    threads = torch_thread.core_layout(rep.torch_threads, rep.num_cpus, torch_thread.node_cores())
    torch.set_num_threads(threads.threads)
    engine = LLMEngine.from_pretrained(resolve_model_dir(cfg.model.source), cfg.engine)
    return engine, cfg


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 interactive requests (default 16)")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--config", default=str(c.REPO_ROOT / "cluster.yaml"))
    p.add_argument("--interactive", type=int, default=None)
    p.add_argument("--flood-factor", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    args.interactive = args.interactive or (8 if args.quick else 16)
    return args


def build_report(args, engine, cfg, runs: tuple, num_offline: int) -> dict:
    import torch

    alone, busy, during, alone_again = runs
    unloaded_p50 = statistics.median(alone + alone_again)  # before and after: less drift
    ratio = statistics.median(busy) / unloaded_p50
    workload = {
        "interactive_requests": args.interactive,
        "offline_requests": num_offline,
        "interactive_max_tokens": args.max_tokens,
        "offline_max_tokens": 96,
        "gap_s": GAP_S,
        "engine": str(cfg.engine),
        "torch_threads": torch.get_num_threads(),
    }
    return {
        "benchmark": "engine_isolation",
        "machine": c.machine_info("cpu", str(engine.dtype).removeprefix("torch.")),
        "workload": workload,
        "ttft_s": {"unloaded": alone, "loaded": busy, "unloaded_after": alone_again},
        "ttft_p50_unloaded_s": unloaded_p50,
        "ttft_p50_loaded_s": statistics.median(busy),
        "during_flood": during,
        "ratio_loaded_over_unloaded": ratio,
        "target": TARGET,
        "target_met": ratio <= TARGET,
    }


def main() -> None:
    args = parse_args()
    engine, cfg = load_engine(args)
    n = args.interactive
    ids = encode(engine.tokenizer, chat_prompts(n * (1 + args.flood_factor)))
    prompts, flood = ids[:n], ids[n:]

    async def run() -> tuple:
        await interactive(engine, prompts[:1], 4)  # warm-up
        alone = await interactive(engine, prompts, args.max_tokens)
        busy, during = await loaded(engine, prompts, flood, args.max_tokens)
        alone_again = await interactive(engine, prompts, args.max_tokens)
        return alone, busy, during, alone_again

    report = build_report(args, engine, cfg, asyncio.run(run()), len(flood))
    keys = ("ttft_p50_unloaded_s", "ttft_p50_loaded_s", "ratio_loaded_over_unloaded")
    print({k: report[k] for k in keys})
    if args.json:
        c.write_json(args.json, report)


if __name__ == "__main__":
    main()
