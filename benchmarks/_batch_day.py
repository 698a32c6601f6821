"""A compressed day against a running app: live interactive traffic on a daily curve, replica
utilisation sampled, and optionally a batch submitted at dawn. Used by benchmarks/batch_valleys.py
and tests/integration/test_batch_valleys.py.

The curve is a raised cosine over `day_s` seconds: valleys at the start and end (night), the
peak at mid-day. The first and last quarter of the day count as valley, the middle half as peak.
Arrivals are an inhomogeneous Poisson process (thinning, fixed seed): a run with and a run without
the batch see exactly the same interactive requests at the same offsets.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass

import httpx

from benchmarks.loadgen import Outcome, one_request
from common.stats import percentile

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "queue"]


@dataclass(frozen=True)
class Day:
    day_s: float
    valley_rps: float
    peak_rps: float
    max_tokens: int = 16
    seed: int = 0

    def rate(self, t_s: float) -> float:
        x = t_s / self.day_s
        return self.valley_rps + (self.peak_rps - self.valley_rps) * 0.5 * (
            1 - math.cos(2 * math.pi * x)
        )

    def phase(self, t_s: float) -> str:
        x = t_s / self.day_s
        return "peak" if 0.25 <= x < 0.75 else "valley"

    def arrivals(self) -> list[tuple[float, str]]:
        """(offset, prompt) of every interactive request of the day."""
        rng, out, t = random.Random(self.seed), [], 0.0
        while True:
            t += rng.expovariate(self.peak_rps)
            if t >= self.day_s:
                return out
            if rng.random() < self.rate(t) / self.peak_rps:
                out.append((t, " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30)))))


def batch_file(num: int, max_tokens: int) -> bytes:
    rows = (
        {
            "custom_id": f"job-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": f"summarise item {i}"}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(num)
    )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


async def _interactive(base: str, day: Day, start: float) -> list[tuple[str, Outcome]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(at: float, prompt: str) -> tuple[str, Outcome]:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            body = {
                "prompt": prompt,
                "max_tokens": day.max_tokens,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "priority": "interactive",
            }
            outcome = await one_request(
                client, f"{base}/v1/completions", body, "interactive", start
            )
            return day.phase(at), outcome

        return list(await asyncio.gather(*(one(at, p) for at, p in day.arrivals())))


async def _sample(app: str, day: Day, start: float, period_s: float) -> list[tuple[str, int, int]]:
    """(phase, running sequences, concurrency limit) of the hot replica, at random times of mean
    `period_s`: a fixed period can lock in phase with the lane's own poll (batch requests start
    on its ticks) and see only the idle part of each cycle."""
    from ray import serve

    handle = serve.get_deployment_handle("hot", app)
    rng, out = random.Random(day.seed + 1), []
    while (t := time.monotonic() - start) < day.day_s:
        info = await handle.info.remote()
        out.append((day.phase(t), info.running, info.live_requests))
        await asyncio.sleep(rng.expovariate(1.0 / period_s))
    return out


def _utilisation(samples: list[tuple[str, int, int]], max_num_seqs: int) -> dict:
    out = {}
    for phase in ("valley", "peak"):
        mine = [s for s in samples if s[0] == phase]
        running = [s[1] for s in mine]
        out[phase] = {
            "num_samples": len(mine),
            "busy_fraction": sum(1 for r in running if r > 0) / max(len(mine), 1),
            "mean_running_seqs": sum(running) / max(len(mine), 1),
            "slot_utilisation": sum(running) / max(len(mine), 1) / max_num_seqs,
        }
    return out


def _ttft(outcomes: list[tuple[str, Outcome]], phase: str | None = None) -> dict:
    ok = [o for p, o in outcomes if o.status == 200 and o.error is None and o.ttft_s is not None]
    ok = [o for p, o in outcomes if (phase is None or p == phase) and o in ok]
    ttfts = [o.ttft_s for o in ok]
    return {
        "num_sent": sum(1 for p, _ in outcomes if phase is None or p == phase),
        "num_ok": len(ok),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_samples_s": [round(x, 4) for x in ttfts],  # pooled across days by the benchmark
    }


async def run_day(base: str, app: str, day: Day, max_num_seqs: int, batch: dict | None) -> dict:
    """One day; `batch` = {"lines": N, "max_tokens": M} submits a batch at dawn, window = day."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    start = time.monotonic()
    batch_id = None
    if batch:
        data = batch_file(batch["lines"], batch["max_tokens"])
        up = await client.files.create(file=("day.jsonl", data), purpose="batch")
        created = await client.batches.create(
            input_file_id=up.id,
            endpoint="/v1/chat/completions",
            completion_window=f"{int(day.day_s)}s",  # type: ignore[arg-type]
        )
        batch_id = created.id
    watch = _watch_estimates(client, batch_id, day, start) if batch_id else asyncio.sleep(0)
    live, samples, estimates = await asyncio.gather(
        _interactive(base, day, start), _sample(app, day, start, 0.25), watch
    )
    report = {
        "interactive": {
            "all": _ttft(live),
            "valley": _ttft(live, "valley"),
            "peak": _ttft(live, "peak"),
        },
        "utilisation": _utilisation(samples, max_num_seqs),
    }
    if batch_id:
        report["batch"] = await _finish(client, batch_id, day)
        report["batch"]["estimates"] = estimates
    return report


ESTIMATE_POLL_S = 0.25


async def _watch_estimates(client, batch_id: str, day: Day, start: float) -> list[dict]:
    """The batch's forecast-based completion estimate as the day goes, every `ESTIMATE_POLL_S`
    while open: a quiet machine finishes the compressed day's batch in about 2 s."""
    seen = []
    while time.monotonic() - start < day.day_s:
        got = await client.batches.retrieve(batch_id)
        if got.status != "in_progress":
            break
        extra = got.model_extra.get("tideserve") or {}
        eta = extra.get("estimated_completion_at")
        seen.append(
            {
                "t_s": round(time.time() - got.created_at, 1),
                "progress": extra.get("progress"),
                "estimated_completion_in_s": None
                if eta is None
                else round(eta - got.created_at, 1),
                "basis": extra.get("estimate_basis"),
            }
        )
        await asyncio.sleep(ESTIMATE_POLL_S)
    return seen


async def _finish(client, batch_id: str, day: Day) -> dict:
    """Wait (up to the window) for the batch, then read its counts and the lane's numbers."""
    deadline = time.monotonic() + day.day_s
    got = await client.batches.retrieve(batch_id)
    while got.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        got = await client.batches.retrieve(batch_id)
    took = (got.completed_at or 0) - got.created_at if got.completed_at else None
    extra = got.model_extra.get("tideserve") or {}
    answered = []
    if got.output_file_id:
        text = (await client.files.content(got.output_file_id)).text
        answered = [json.loads(x)["custom_id"] for x in text.splitlines()]
    return {
        "id": batch_id,
        "status": got.status,
        "request_counts": got.request_counts.model_dump(),
        "num_answered_once": len(set(answered)) if len(answered) == len(set(answered)) else -1,
        "completed_in_s": took,
        "window_s": day.day_s,
        "inside_window": took is not None and took <= day.day_s,
        "tokens_done": extra.get("tokens_done"),
        "idle_capacity_used_replica_s": extra.get("idle_capacity_used_replica_s"),
    }
