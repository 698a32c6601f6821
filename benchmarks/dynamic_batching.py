"""Dynamic batching of an embedding model under open-loop Poisson load (R2/R7/R10).

Texts have the token lengths of the Azure LLM 2023 conversation trace's prompts (ContextTokens),
truncated to the model's limit (all-MiniLM-L6-v2: 256 tokens with [CLS]/[SEP]). Requests arrive
as a Poisson process at three rates, from below capacity to overload; latency runs from each
request's scheduled arrival (open loop: a slow server does not slow the arrivals down).

Systems, all in this one process on the same model, the same tokenization and one executor
thread (a replica has one model; batches run one at a time):
  none             each request runs alone, in arrival order
  serve_batch      Ray Serve's own @serve.batch code (max_batch_size 16, batch_wait_timeout_s
                   0.02) run in-process: its queue and batching loop are Serve's, only the check
                   that reads the replica context (absent outside a replica) is switched off
  tideserve        serving/embed/batch_loop.py: 16 / 20 ms, length buckets, staggered windows,
                   bounded queue (overflow is refused at once: a 429 in the server)
  tideserve_tuned  the same with the R7 tuner (starts at 8 / 50 ms)

    .venv/bin/python benchmarks/dynamic_batching.py --quick --json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks._common import (
    REPO_ROOT,
    TRACE_PATH,
    cpu_snapshot,
    cpu_used,
    log,
    machine_info,
    open_trace,
    percentile,
    write_json,
)
from serving.config.dynamic_batching import DynamicBatchingSection
from serving.embed.batch_loop import BatchLoop, QueueFullError
from serving.embed.model import EmbeddingModel
from serving.model_source import resolve_model_dir

SYSTEMS = ("none", "serve_batch", "tideserve", "tideserve_tuned")
BUCKETS = (32, 64, 128, 192, 256)


def trace_lengths(n: int, seed: int, limit: int) -> list[int]:
    with open_trace(TRACE_PATH) as f:
        context = [int(row["ContextTokens"]) for row in csv.DictReader(f)]
    rng = random.Random(seed)
    return [min(max(rng.choice(context), 1), limit) for _ in range(n)]


def single_token_words(tokenizer, count: int = 2000) -> list[str]:
    """Lowercase vocabulary words the tokenizer keeps whole, so k words are k tokens."""
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) >= 3]
    words = sorted(words)[:count]
    return [w for w in words if len(tokenizer(w, add_special_tokens=False).input_ids) == 1]


def make_texts(model: EmbeddingModel, lengths: list[int], seed: int) -> list[str]:
    rng, words = random.Random(seed), single_token_words(model.tokenizer)
    specials = len(model.prefix_ids) + len(model.suffix_ids)
    return [" ".join(rng.choices(words, k=max(1, n - specials))) for n in lengths]


class Systems:
    """One `embed(ids) -> vector` coroutine per system, sharing the model and one executor."""

    def __init__(self, model: EmbeddingModel, tuner_interval_s: float) -> None:
        self.model = model
        self.lock = asyncio.Lock()
        self.tuner_interval_s = tuner_interval_s

    async def run(self, batch: list[list[int]]) -> list[list[float]]:
        async with self.lock:  # one model: batches never overlap
            return await asyncio.to_thread(self.model.embed, batch)

    def build(self, name: str):
        if name == "none":
            return lambda ids: self._alone(ids)
        if name == "serve_batch":
            return _serve_batch(self.run)
        tuned = name == "tideserve_tuned"
        cfg = DynamicBatchingSection(
            max_batch_size=16,
            window_s=0.02,
            bucket_edges_tokens=BUCKETS,
            stagger_slices=2,
            max_queue=64,
            tuner=tuned,
            p99_target_s=1.0,
            tuner_interval_s=self.tuner_interval_s,
        )
        loop = BatchLoop(self.run, cfg)
        embed = lambda ids: loop.submit(ids, len(ids))  # noqa: E731
        embed.loop = loop
        return embed

    async def _alone(self, ids):
        return (await self.run([ids]))[0]


def _serve_batch(run):
    from ray import serve
    from ray.serve import batching as ray_batching

    # Outside a replica this one warning check reads a replica context that does not exist.
    ray_batching._BatchQueue._warn_if_max_batch_size_exceeds_max_ongoing_requests = lambda _: None

    class Handler:
        @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.02)
        async def embed(self, batch: list[list[int]]) -> list[list[float]]:
            return await run(batch)

    return Handler().embed


async def one_run(embed, texts, tokenize, rate_rps, duration_s, seed, cap_s) -> dict:
    """One segment: Poisson arrivals for duration_s, then up to cap_s more for the backlog;
    requests still unfinished then count as unfinished (their latency is at least cap_s)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate_rps)
        if t > duration_s:
            break
        arrivals.append(t)
    out = {"lat": [], "done": [], "outputs": {}, "rejected": 0}
    start, cpu0 = time.perf_counter(), time.process_time()

    async def request(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        ids = tokenize(texts[(seed * 7919 + i) % len(texts)])
        try:
            vector = await embed(ids)
        except QueueFullError:
            out["rejected"] += 1
            return
        end = time.perf_counter()
        out["lat"].append(end - (start + at))
        out["done"].append(end - start)
        if i < 20:
            out["outputs"][(seed * 7919 + i) % len(texts)] = vector

    tasks = [asyncio.ensure_future(request(i, at)) for i, at in enumerate(arrivals)]
    _, pending = await asyncio.wait(tasks, timeout=duration_s + cap_s)
    for task in pending:
        task.cancel()
    out["unfinished"] = len(pending)
    out["num_requests"] = len(arrivals)
    out["span_s"] = max(out["done"], default=duration_s)
    out["cpu_s"] = time.process_time() - cpu0
    return out


def summarize(rate_rps: float, segments: list[dict]) -> dict:
    """One system at one rate over its interleaved segments."""
    lat = [x for s in segments for x in s["lat"]]
    unfinished = sum(s["unfinished"] for s in segments)
    cap_lat = [s["span_s"] for s in segments]  # an unfinished request waited at least this
    lat_all = lat + [max(cap_lat)] * unfinished
    completed = len(lat)
    return {
        "rate_rps": rate_rps,
        "num_requests": sum(s["num_requests"] for s in segments),
        "num_completed": completed,
        "num_rejected": sum(s["rejected"] for s in segments),
        "num_unfinished": unfinished,
        "throughput_rps": round(completed / sum(s["span_s"] for s in segments), 3),
        "latency_p50_s": round(percentile(lat_all, 50), 4),
        "latency_p99_s": round(percentile(lat_all, 99), 4),
        "cpu_s_per_request": round(sum(s["cpu_s"] for s in segments) / max(completed, 1), 4),
    }


def padding_cost(lengths: list[int], batch_size: int = 16) -> dict:
    """Model tokens computed per request at saturation (full batches), with no noise at all:
    arrival-order batches pad to their longest (serve_batch); bucketed batches pad within
    their bucket (tideserve). On a CPU the forward's cost is about linear in these tokens."""
    from serving.embed.batching import bucket_of, padded_tokens

    def per_request(batches):
        return sum(padded_tokens(b) for b in batches) / sum(len(b) for b in batches)

    arrival = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    groups: dict[int, list[int]] = {}
    for n in lengths:
        groups.setdefault(bucket_of(n, BUCKETS), []).append(n)
    bucketed = [
        g[i : i + batch_size] for g in groups.values() for i in range(0, len(g), batch_size)
    ]
    return {
        "real_tokens_per_request": round(sum(lengths) / len(lengths), 1),
        "serve_batch_tokens_per_request": round(per_request(arrival), 1),
        "tideserve_tokens_per_request": round(per_request(bucketed), 1),
    }


def capacity_rps(model: EmbeddingModel, texts: list[str]) -> float:
    """Requests/s of one-at-a-time execution: the yardstick for the three rates."""
    ids = [model.tokenize(t) for t in texts[:30]]
    model.embed(ids[:1])  # warm
    t0 = time.perf_counter()
    for x in ids:
        model.embed([x])
    return len(ids) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs (~4 min)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--model", default="embedded", help="'embedded' or a model directory")
    ap.add_argument("--rates", default="0.5,0.9,1.5", help="multiples of measured capacity")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    duration_s = 10.0 if args.quick else 20.0
    model = EmbeddingModel.load(resolve_model_dir(args.model, task="embed"))
    lengths = trace_lengths(2000, args.seed, model.max_tokens)
    texts = make_texts(model, lengths, args.seed)
    cap = capacity_rps(model, texts)
    rates = [round(float(x) * cap, 2) for x in args.rates.split(",")]
    log(f"capacity alone ~{cap:.1f} req/s; rates {rates}; {duration_s:.0f} s per run")
    before = cpu_snapshot()
    runs, max_diff, reps = [], 0.0, 2 if args.quick else 3
    for rate in rates:
        segments: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
        tuner_notes: dict[str, list] = {}
        for rep in range(reps):  # interleaved, rotated: other load on the machine hits all alike
            order = SYSTEMS[rep % len(SYSTEMS) :] + SYSTEMS[: rep % len(SYSTEMS)]
            for name in order:
                embed = Systems(model, tuner_interval_s=duration_s / 5).build(name)
                seg = asyncio.run(
                    one_run(embed, texts, model.tokenize, rate, duration_s, rep, duration_s * 3)
                )
                for i, vector in seg.pop("outputs").items():
                    alone = model.embed([model.tokenize(texts[i])])[0]
                    max_diff = max(max_diff, float(np.max(np.abs(np.subtract(vector, alone)))))
                segments[name].append(seg)
                loop = getattr(embed, "loop", None)
                if loop is not None and loop.tuner_cfg is not None:
                    notes = [f"{d.action}: {d.reason}" for _, d in loop.tuner_log if d.changed]
                    tuner_notes.setdefault("tuner", []).extend(notes)
                    tuner_notes.setdefault("final_size_window", []).append(
                        [loop.policy.target_size, loop.policy.window_s]
                    )
        for name in SYSTEMS:
            res = summarize(rate, segments[name])
            if name == "tideserve_tuned":
                res.update(tuner_notes)
            runs.append({"system": name, **res})
            log(f"{name:16s} {_fmt(res)}")
    _, foreign = cpu_used(before, cpu_snapshot())
    report = _report(runs, rates, cap, duration_s, max_diff, foreign, args)
    report["padding"] = padding_cost([len(model.tokenize(t)) for t in texts])
    report["machine"] = machine_info("cpu", "float32")
    print(_table(runs))
    print("at the highest rate:", report["highest_rate"])
    if args.json:
        write_json(args.json, report)


def _fmt(r: dict) -> str:
    return (
        f"rate {r['rate_rps']:6.2f}  thr {r['throughput_rps']:6.2f}  "
        f"p50 {r['latency_p50_s']:.3f}  p99 {r['latency_p99_s']:.3f}  "
        f"done {r['num_completed']}/{r['num_requests']}  rejected {r['num_rejected']}  "
        f"unfinished {r['num_unfinished']}  cpu/req {r['cpu_s_per_request']:.3f}"
    )


def _table(runs: list[dict]) -> str:
    return "\n".join(f"{r['system']:16s} {_fmt(r)}" for r in runs)


def _report(runs, rates, cap, duration_s, max_diff, foreign_cpu_s, args) -> dict:
    top = {r["system"]: r for r in runs if r["rate_rps"] == rates[-1]}
    base = top["serve_batch"]
    highest = {
        name: {
            "throughput_x": round(top[name]["throughput_rps"] / base["throughput_rps"], 3),
            "p99_x": round(top[name]["latency_p99_s"] / base["latency_p99_s"], 3),
            "cpu_per_request_x": round(
                top[name]["cpu_s_per_request"] / base["cpu_s_per_request"], 3
            ),
            "rejected": top[name]["num_rejected"],
        }
        for name in ("tideserve", "tideserve_tuned")
    }
    return {
        "benchmark": "dynamic_batching",
        "model": args.model,
        "trace": str(TRACE_PATH.relative_to(REPO_ROOT)),
        "quick": args.quick,
        "torch_threads": args.threads,
        "duration_s_per_segment": duration_s,
        "segments_per_run": 2 if args.quick else 3,
        "capacity_alone_rps": round(cap, 2),
        "max_abs_diff_vs_alone": max_diff,
        "foreign_cpu_s": foreign_cpu_s,
        "serve_batch_mode": "Ray Serve's @serve.batch code in-process (replica-context check off)",
        "highest_rate": highest,
        "runs": runs,
    }


if __name__ == "__main__":
    main()
