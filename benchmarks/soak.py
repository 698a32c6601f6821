"""Soak: mixed-tier open-loop traffic for 30 minutes (--quick: 2), memory and KV watched.

    python benchmarks/soak.py [--quick] [--json PATH] [--rate RPS]

Poisson arrivals of 60% interactive, 25% analytical, 15% offline requests of mixed prompt and
output lengths, a few streams abandoned mid-way (client timeouts) and a few bad requests mixed
in. The RSS of the app's Serve processes is sampled every 5 s; pass when the last quarter's mean
RSS is within 5% of the second quarter's (after warm-up), no request got a 5xx, and every
replica's KV blocks, reservations and live requests are back to zero at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import start_local_ray, write_json

PORT, APP = 18741, "soak"
MIX = (("interactive", 0.60), ("analytical", 0.25), ("offline", 0.15))
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "queue"]


def make_body(rng: random.Random) -> tuple[str, dict]:
    from benchmarks.loadgen import body_for

    tier = rng.choices([t for t, _ in MIX], [w for _, w in MIX])[0]
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60)))
    body = body_for(tier, prompt, rng.choice((8, 16, 32, 64)))
    roll = rng.random()
    if roll < 0.02:
        body["max_tokens"] = -1  # bad input: a 400 that must leave nothing behind
    elif roll < 0.04:
        body["temperature"] = 0.8  # sampled, not greedy
    return tier, body


async def abandoners(url: str, duration_s: float, period_s: float) -> int:
    """A client that hangs up after two frames now and then: the server must free its KV."""
    import httpx

    n, start = 0, time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() - start < duration_s:
            body = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}
            async with client.stream("POST", url, json=body) as r:
                frames = 0
                async for line in r.aiter_lines():
                    frames += bool(line)
                    if frames == 2:
                        n += 1
                        break  # leaving the block closes the connection mid-stream
            await asyncio.sleep(period_s)
    return n


async def soak(url: str, duration_s: float, rate_rps: float) -> dict:
    from benchmarks.loadgen import open_loop, sample_rss, summarize

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(APP, 5.0, stop))
    outcomes, abandoned = await asyncio.gather(
        open_loop(url, rate_rps, duration_s, make_body, seed=7),
        abandoners(url, duration_s, 10.0),
    )
    stop.set()
    rss = await sampler
    q = max(1, len(rss) // 4)
    second, last = rss[q : 2 * q], rss[-q:]
    growth = (sum(last) / len(last)) / (sum(second) / len(second)) - 1 if second else 0.0
    statuses: dict[str, int] = {}
    for o in outcomes:
        statuses[str(o.status)] = statuses.get(str(o.status), 0) + 1
    return {
        "tiers": summarize(outcomes, duration_s),
        "statuses": statuses,
        "num_5xx_or_transport_errors": sum(o.status == 0 or o.status >= 500 for o in outcomes),
        "num_abandoned_streams": abandoned,
        "rss_mib": [round(r / 2**20, 1) for r in rss],
        "rss_growth_last_vs_second_quarter": growth,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second offered")
    args = parser.parse_args()
    import ray
    from ray import serve

    from serving.tiny_models import save_tiny_model_dir
    from tests.integration.serve_helpers import IDLE, app_args, deploy, wait_idle

    duration_s = 120.0 if args.quick else 1800.0
    start_local_ray()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model_dir(Path(tmp) / "tiny", arch="qwen2", seed=7)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        deploy(app_args(model_dir), APP, "/")
        started = time.time()
        result = asyncio.run(soak(f"http://127.0.0.1:{PORT}/v1/completions", duration_s, args.rate))
        end_states = wait_idle(APP, timeout_s=60)
        serve.shutdown()
    ray.shutdown()
    report = {
        "benchmark": "soak",
        "quick": args.quick,
        "duration_s": duration_s,
        "rate_rps": args.rate,
        "started_unix_s": started,
        **result,
        "end_kv_states": end_states,
        "targets": {
            "rss_flat_within_5pct": result["rss_growth_last_vs_second_quarter"] <= 0.05,
            "kv_back_to_zero": all(s == IDLE for s in end_states.values()),
            "no_5xx": result["num_5xx_or_transport_errors"] == 0,
        },
    }
    print(json.dumps({k: v for k, v in report.items() if k != "rss_mib"}, indent=2))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
