"""Open-loop HTTP load against an OpenAI-compatible endpoint, for tests and benchmarks.

Open loop: requests leave on a Poisson schedule whatever the server does, as real users do, so
an overloaded server shows up as 429s and latency, not as a politely slowed client. Each request
streams, so time to first token (TTFT) is measured where the client sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from benchmarks._common import cpu_snapshot, cpu_used
from common.stats import percentile
from serving.ray_internals import local_raylet_pid


@dataclass(frozen=True, slots=True)
class Outcome:
    tier: str
    status: int
    sent_s: float  # since the run started
    latency_s: float
    ttft_s: float | None = None
    num_chunks: int = 0
    retry_after: str | None = None
    error: str | None = None  # transport error, or an error event inside a 200 stream


def body_for(tier: str, prompt: str, max_tokens: int) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "priority": tier,
    }


async def one_request(
    client: httpx.AsyncClient, url: str, body: dict, tier: str, start: float
) -> Outcome:
    sent = time.monotonic()
    ttft, chunks, error = None, 0, None
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return Outcome(
                    tier, r.status_code, sent - start, time.monotonic() - sent,
                    retry_after=r.headers.get("retry-after"), error=_error_message(r),
                )  # fmt: skip
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                frame = json.loads(line[6:])
                if "error" in frame:
                    error = frame["error"]["message"]
                elif frame.get("choices") and frame["choices"][0].get("text"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - sent
            status = r.status_code
    except httpx.HTTPError as err:
        return Outcome(tier, 0, sent - start, time.monotonic() - sent, error=repr(err)[:200])
    return Outcome(tier, status, sent - start, time.monotonic() - sent, ttft, chunks, error=error)


def _error_message(r: httpx.Response) -> str:
    """The OpenAI-shaped error body's message (the server's reason for a 4xx), else the text."""
    try:
        return str(r.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


def refusal_reasons(outcomes: list[Outcome], top: int = 5) -> dict[str, int]:
    """The most common reasons given with a 429, numbers replaced by N so that alike ones add."""
    counts = Counter(
        re.sub(r"\d+(\.\d+)?", "N", o.error or "") for o in outcomes if o.status == 429
    )
    return dict(counts.most_common(top))


async def open_loop(
    url: str,
    rate_rps: float,
    duration_s: float,
    make_body: Callable[[random.Random], tuple[str, dict]],
    seed: int = 0,
    timeout_s: float = 120.0,
) -> list[Outcome]:
    """Poisson arrivals at rate_rps for duration_s; waits for every request to finish."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.monotonic()
        tasks, at = [], 0.0
        while True:
            at += rng.expovariate(rate_rps)
            if at >= duration_s:
                break
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            tier, body = make_body(rng)
            tasks.append(asyncio.create_task(one_request(client, url, body, tier, start)))
        return list(await asyncio.gather(*tasks))


async def closed_loop(
    url: str, concurrency: int, duration_s: float, body: dict, timeout_s: float = 120.0
) -> list[Outcome]:
    """`concurrency` clients back to back: the throughput the server sustains (its capacity)."""
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        start = time.monotonic()
        out: list[Outcome] = []

        async def worker() -> None:
            while time.monotonic() - start < duration_s:
                out.append(await one_request(client, url, body, body["priority"], start))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return out


def summarize(outcomes: list[Outcome], duration_s: float) -> dict:
    """Per tier: counts by status, TTFT and latency percentiles of the admitted, throughput."""
    tiers: dict[str, dict] = {}
    for tier in sorted({o.tier for o in outcomes}):
        mine = [o for o in outcomes if o.tier == tier]
        ok = [o for o in mine if o.status == 200 and o.error is None]
        ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
        lats = [o.latency_s for o in ok]
        statuses: dict[str, int] = {}
        for o in mine:
            key = str(o.status) if o.error is None or o.status != 200 else "200+error"
            statuses[key] = statuses.get(key, 0) + 1
        tiers[tier] = {
            "num_sent": len(mine),
            "statuses": statuses,
            "ok_rps": len(ok) / duration_s,
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99),
            "latency_p50_s": percentile(lats, 50),
            "latency_p99_s": percentile(lats, 99),
            "retry_after_missing": sum(1 for o in mine if o.status == 429 and not o.retry_after),
            "refusal_reasons": refusal_reasons(mine),
        }
    return tiers


def serve_rss_bytes(app: str, raylet_pid: int | None = None) -> int:
    """Resident memory of this app's Serve replicas and the HTTP proxy (by process title)."""
    import psutil

    total = 0
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        title = " ".join(proc.info["cmdline"] or [])
        if raylet_pid is not None and proc.info["ppid"] != raylet_pid:
            continue
        if title.startswith((f"ray::ServeReplica:{app}:", "ray::ProxyActor")):
            with contextlib.suppress(psutil.Error):  # it may have exited meanwhile
                total += proc.memory_info().rss
    return total


async def sample_rss(app: str, period_s: float, stop: asyncio.Event) -> list[int]:
    samples, raylet = [], local_raylet_pid()
    while not stop.is_set():
        samples.append(serve_rss_bytes(app, raylet))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
    return samples


# ----- the two hardening scenarios (tests/integration/test_overload.py, benchmarks/hardening.py)
def _constant(tier: str, prompt: str, max_tokens: int):
    body = body_for(tier, prompt, max_tokens)
    return lambda _rng: (tier, body)


def goodput_rps(outcomes: list[Outcome], ttft_slo_s: float, e2e_slo_s: float, span_s: float):
    """Requests completed within their SLO (first token by ttft_slo_s, done by e2e_slo_s) per
    second of the offered window: what the server delivered that was still worth having."""
    good = [
        o
        for o in outcomes
        if o.status == 200 and o.error is None and o.ttft_s is not None
        and o.ttft_s <= ttft_slo_s and o.latency_s <= e2e_slo_s
    ]  # fmt: skip
    return len(good) / span_s


async def offered_load(
    url: str, rate_rps: float, duration_s: float, body: dict, slo_s: tuple[float, float], seed=0
) -> dict:
    """`rate_rps` open-loop for duration_s: per-tier summary, goodput, 5xx, bare 429s."""
    make_body = _constant(body["priority"], *_args(body))
    out = await open_loop(url, rate_rps, duration_s, make_body, seed)
    return {
        "offered_rps": rate_rps,
        "tiers": summarize(out, duration_s),
        "goodput_rps": goodput_rps(out, *slo_s, duration_s),
        "num_5xx_or_transport_errors": sum(o.status == 0 or o.status >= 500 for o in out),
        "num_refused": sum(o.status == 429 for o in out),
        "num_429_without_retry_after": sum(o.status == 429 and not o.retry_after for o in out),
        "retry_after_values_s": sorted({o.retry_after for o in out if o.retry_after}),
    }


async def overload_scenario(
    url: str,
    app: str,
    duration_s: float,
    probe_s: float,
    concurrency: int,
    factors: tuple[float, ...] = (3.0,),
    slo_s: tuple[float, float] = (1.0, 20.0),
) -> dict:
    """Measure capacity closed-loop, then offer each `factor` x capacity open-loop for
    duration_s, one after the other, sampling the Serve processes' RSS all along."""
    body = body_for("interactive", "def main(): return", 64)
    capacity_rps = _capacity_rps(await closed_loop(url, concurrency, probe_s, body), probe_s)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(app, 1.0, stop))
    runs = {}
    for i, factor in enumerate(factors):
        before = cpu_snapshot()
        run = await offered_load(url, factor * capacity_rps, duration_s, body, slo_s, seed=i)
        run["cpu_cores_by_process"] = _cores(cpu_used(before, cpu_snapshot()), duration_s)
        runs[f"{factor:g}x"] = run
    stop.set()
    rss = await sampler
    return {
        "capacity_rps": capacity_rps,
        "duration_s": duration_s,
        "ttft_slo_s": slo_s[0],
        "e2e_slo_s": slo_s[1],
        "runs": runs,
        "rss_bytes": {"first": rss[0], "max": max(rss), "last": rss[-1], "samples": len(rss)},
    }


def _cores(used: tuple[dict[str, float], float], span_s: float) -> dict[str, float]:
    """Where the machine's CPU went during one offered load, in cores (CPU seconds per second of
    the window) per process role (benchmarks/_common.py `process_role`; this process is the
    load client); `other_jobs` is busy CPU outside this process tree."""
    by_role, foreign_s = used
    out = {role: round(cpu_s / span_s, 3) for role, cpu_s in by_role.items()}
    return out | {"other_jobs": round(foreign_s / span_s, 3)}


def _capacity_rps(probe: list[Outcome], probe_s: float) -> float:
    """Completed requests per second of a closed-loop probe; a probe that completed nothing
    means the endpoint is not serving, which no overload figure can be measured against."""
    num_ok = sum(o.status == 200 for o in probe)
    if num_ok == 0:
        seen = sorted({(o.status, o.error) for o in probe}, key=str)[:3]
        raise RuntimeError(f"capacity probe: 0 of {len(probe)} requests succeeded: {seen}")
    return num_ok / probe_s


def _args(body: dict) -> tuple[str, int]:
    return body["prompt"], body["max_tokens"]


async def isolation_scenario(
    url: str, duration_s: float, probe_s: float, concurrency: int, interactive_rps: float,
    factor: float = 10.0,
) -> dict:  # fmt: skip
    """Interactive TTFT alone, then beside an offline flood at `factor` x offline capacity."""
    flood = body_for("offline", "summarise this document: " + "x " * 40, 96)
    capacity_rps = _capacity_rps(await closed_loop(url, concurrency, probe_s, flood), probe_s)
    probe_body = _constant("interactive", "def main(): return", 16)
    alone = await open_loop(url, interactive_rps, duration_s, probe_body, seed=1)
    loaded_interactive, loaded_offline = await asyncio.gather(
        open_loop(url, interactive_rps, duration_s, probe_body, seed=1),
        open_loop(url, factor * capacity_rps, duration_s, _constant("offline", *_args(flood))),
    )
    unloaded = summarize(alone, duration_s)["interactive"]
    loaded = summarize(loaded_interactive + loaded_offline, duration_s)
    return {
        "offline_capacity_rps": capacity_rps,
        "offline_offered_rps": factor * capacity_rps,
        "interactive_rps": interactive_rps,
        "duration_s": duration_s,
        "unloaded_interactive": unloaded,
        "loaded": loaded,
        "ttft_p99_ratio": loaded["interactive"]["ttft_p99_s"] / max(unloaded["ttft_p99_s"], 1e-9),
        "ttft_p50_ratio": loaded["interactive"]["ttft_p50_s"] / max(unloaded["ttft_p50_s"], 1e-9),
    }
