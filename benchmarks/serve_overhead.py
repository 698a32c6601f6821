"""Serving overhead: one request set through the engine directly, a Serve handle, and HTTP.

    python benchmarks/serve_overhead.py [--quick] [--json PATH] [--model embedded|tiny]
        [--concurrency 16] [--num-requests N] [--seed S] [--serve-env KEY=VALUE ...]

engine  LLMEngine.stream() in this process (run first, before Ray starts)
handle  the Serve app's ingress through serve.get_app_handle(...).generate_stream (stream=True)
http    POST /v1/completions with stream=true on 127.0.0.1:18500, SSE frames until [DONE]

Closed loop: `--concurrency` requests in flight, the next starts when one ends. Latency and TTFT
are per request, from its start. Greedy, EOS ignored, so every path generates exactly the
requested tokens (checked). One hot replica with torch_threads=1 vs an engine with 1 torch thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _common as c

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray

APP, SERVED_NAME, HTTP_PORT, TARGET = "tideserve", "bench", 18500, 0.85
# fmt: off
SCALING = c.Scaling(divisor=8, max_prompt=256, max_output=64)
ENGINE = {"kv_mode": "reserve", "max_num_seqs": 32, "min_num_seqs": 16,
          "max_num_batched_tokens": 512, "max_model_len": 1024, "kv_cache_bytes": 64 * 2**20}
TINY = dict(arch="llama", seed=0, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, vocab_size=512)
APP_ARGS = {
    "pools": {"hot": {"num_replicas": 1},
              "cold": {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0}},
    "replica": {"num_cpus": 0, "torch_threads": 1},
    "tiers": {"interactive": {"max_waiting": 1024, "ttft_p99_s": 600, "e2e_p99_s": 3600,
                              "max_queue_wait_s": 600}},
}
# A fresh local cluster of our own (never someone else's: address="local"), bound to 127.0.0.1.
RAY_INIT = dict(address="local", num_cpus=2, include_dashboard=False,
                _node_ip_address="127.0.0.1", log_to_driver=False)
# fmt: on
NOTES = (
    "The engine path runs in this process before Ray starts, with torch.set_num_threads(1); "
    "the Serve paths run one hot replica (torch_threads=1, num_cpus=0) that shares the machine's "
    "cores with the ingress replica, the HTTP proxy, the Serve controller, GCS, raylet and this "
    "client process: that sharing is part of the overhead measured. handle = client -> ingress -> "
    "replica (two streaming hops); http adds the proxy (client -> proxy -> ingress -> replica) "
    "and SSE encoding/parsing. TTFT: first delta with token ids (engine, handle), first SSE frame "
    "with text (http). cpu_s_by_process: CPU seconds each process used during the measured run; "
    "foreign_cpu_s: busy CPU on the machine outside this benchmark's processes (other jobs). "
    "engine_running_*: sequences the serving engine held, sampled every 0.25 s (the replica's "
    "via its info() method). tokens_per_chunk: tokens per streamed message the client received."
)


async def sample_engine(poll, samples: list[tuple[int, int]], period_s: float = 0.25) -> None:
    """(running, waiting) of the serving engine every period, until cancelled."""
    while True:
        await asyncio.sleep(period_s)
        samples.append(await poll())


def _occupancy(samples: list[tuple[int, int]]) -> dict:
    if not samples:
        return {}
    run, wait, k = [s[0] for s in samples], [s[1] for s in samples], len(samples)
    mean = {"engine_running_mean": sum(run) / k, "engine_waiting_mean": sum(wait) / k}
    return {**mean, "engine_running_max": max(run), "engine_samples": k}


async def run_path(name, reqs, one, concurrency, poll, after_warmup=None) -> c.RunResult:
    """Warm up with 2 short requests, then measure, recording CPU time per process and how
    many sequences the engine held (`poll` -> (running, waiting), sampled every 0.25 s)."""
    warm = [c.Request(r.prompt[:16], 4) for r in reqs[:2]]
    await c.closed_loop(name + "_warmup", warm, one, concurrency)
    if after_warmup:
        after_warmup()
    c.log(f"{name}: {len(reqs)} requests, concurrency {concurrency}")
    samples: list[tuple[int, int]] = []
    sampler = asyncio.create_task(sample_engine(poll, samples))
    before = c.cpu_snapshot()
    try:
        res = await c.closed_loop(name, reqs, one, concurrency)
    finally:
        used, foreign = c.cpu_used(before, c.cpu_snapshot())
        sampler.cancel()
    res.extra.update(_occupancy(samples))
    res.extra |= {"cpu_s_by_process": used, "foreign_cpu_s": foreign}
    c.log(f"{name}: {res.num_tokens / res.wall_s:.1f} tok/s in {res.wall_s:.1f}s; CPU s {used}")
    return res


# ----- the three paths --------------------------------------------------------------------------
async def _count(stream, mark: c.Mark, token_ids) -> int:
    n = 0
    async for part in stream:
        if new := len(token_ids(part)):
            mark.token()
        n += new
    return n


async def engine_one(engine, req: c.Request, mark: c.Mark) -> int:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=req.max_new_tokens, temperature=0, ignore_eos=True)
    return await _count(engine.stream(req.prompt, params), mark, lambda d: d.token_ids)


async def handle_one(handle, req: c.Request, mark: c.Mark) -> int:
    kw = dict(max_tokens=req.max_new_tokens, temperature=0.0, ignore_eos=True)
    gen = handle.generate_stream.remote(req.prompt, priority="interactive", **kw)
    return await _count(gen, mark, lambda part: part.token_ids)


async def http_one(client, req: c.Request, mark: c.Mark) -> int:
    body = dict(model=SERVED_NAME, prompt=req.prompt, max_tokens=req.max_new_tokens, stream=True)
    body |= dict(temperature=0, ignore_eos=True, stream_options={"include_usage": True})
    usage = None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                mark.token()
            usage = chunk.get("usage") or usage
    if usage is None:
        raise RuntimeError("no usage chunk in the stream")
    return usage["completion_tokens"]


def run_engine(model_dir: Path, reqs: list[c.Request], concurrency: int) -> tuple:
    from serving.engine import EngineConfig, LLMEngine

    torch.set_num_threads(1)  # the replica runs with torch_threads=1: equal compute
    engine = LLMEngine.from_pretrained(model_dir, EngineConfig(**ENGINE))
    info = {
        "params": sum(p.numel() for p in engine.model.parameters()),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "vocab_size": engine.vocab_size,
        "kv_cache_tokens": engine.pool.num_blocks * engine.pool.block_size_tokens,
    }

    async def poll() -> tuple[int, int]:
        st = engine.stats()
        return st.num_running, st.num_waiting

    one = partial(engine_one, engine)
    res = asyncio.run(run_path("engine", reqs, one, concurrency, poll, engine.step_log.clear))
    res.extra["engine_steps"] = c.step_stats(engine.step_log)
    return res, info


def app_args(model_dir: Path) -> dict:
    """One hot replica only (no cold one), so the comparison is one engine vs one replica."""
    model = {"source": str(model_dir), "served_name": SERVED_NAME}
    return {"model": model, "engine": dict(ENGINE), **APP_ARGS}


def start_serve(model_dir: Path, serve_env: dict) -> None:
    env = {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", **serve_env}
    os.environ.update(env)  # before importing ray; raylet and every worker inherit it
    import ray
    from ray import serve

    from serving.app import build_app

    ray.init(**RAY_INIT, runtime_env={"env_vars": env})
    serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT})
    serve.run(build_app(app_args(model_dir)), name=APP, route_prefix="/", blocking=False)
    handle, deadline = serve.get_app_handle(APP), time.monotonic() + 300
    while time.monotonic() < deadline:  # ready = the ingress answers through the hot pool
        try:
            handle.generate.remote([5, 6, 7], max_tokens=1).result(timeout_s=30)
            return
        except Exception as err:
            c.log(f"waiting for the app: {type(err).__name__}")
            time.sleep(2.0)
    raise TimeoutError(f"app not ready: {serve.status()}")


async def serve_paths(reqs: list[c.Request], concurrency: int) -> list[c.RunResult]:
    import httpx
    from ray import serve

    hot = serve.get_deployment_handle("hot", APP)

    async def poll() -> tuple[int, int]:
        info = await hot.info.remote()
        return info.running, info.waiting

    handle = serve.get_app_handle(APP).options(stream=True)
    out = [await run_path("handle", reqs, partial(handle_one, handle), concurrency, poll)]
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    base = f"http://127.0.0.1:{HTTP_PORT}"
    async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as client:
        out.append(await run_path("http", reqs, partial(http_one, client), concurrency, poll))
    return out


def run_serve(model_dir: Path, reqs: list[c.Request], args) -> list[c.RunResult]:
    import ray
    from ray import serve

    t0 = time.perf_counter()
    try:
        start_serve(model_dir, dict(args.serve_env))
        c.log(f"serve app ready in {time.perf_counter() - t0:.1f}s")
        return asyncio.run(serve_paths(reqs, args.concurrency))
    finally:
        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()


# ----- report -----------------------------------------------------------------------------------
def build_report(args, model: dict, workload: dict, results: list[c.RunResult]) -> dict:
    runs = {r.name: {**r.summary(), **r.extra} for r in results}
    eng, hnd, http = runs.get("engine"), runs.get("handle"), runs.get("http")
    ratios = {
        "http_over_engine": c.ratio(http, eng, "tokens_per_s"),
        "handle_over_engine": c.ratio(hnd, eng, "tokens_per_s"),
        "http_over_handle": c.ratio(http, hnd, "tokens_per_s"),
        "latency_p50_http_over_engine": c.ratio(http, eng, "latency_p50_s"),
        "ttft_p50_http_over_engine": c.ratio(http, eng, "ttft_p50_s"),
    }
    hoe = ratios["http_over_engine"]
    machine = c.machine_info("cpu", model["dtype"])
    machine["torch_threads"] = 1
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "benchmark": "serve_overhead",
        "machine": machine,
        "model": model,
        "workload": workload,
        "runs": [{"path": s.pop("name"), **s} for s in runs.values()],
        "ratios": ratios,
        "targets": {"http_ge_0_85_engine": None if hoe is None else bool(hoe >= TARGET)},
        "notes": NOTES,
    }


def print_report(report: dict) -> None:
    print(c.format_table([{"name": r["path"], **r} for r in report["runs"]]))
    print("ratios: " + ", ".join(f"{k}={v:.3f}" for k, v in report["ratios"].items() if v))
    print(f"targets: {report['targets']}")
    for r in report["runs"]:
        held = f"{r.get('engine_running_mean', 0):.1f} mean, {r.get('engine_running_max')} max"
        cpu = f"cpu s {r['cpu_s_by_process']} foreign={r['foreign_cpu_s']}"
        print(f"{r['path']:<7} engine running {held}; {r['tokens_per_chunk']:.2f} tok/chunk; {cpu}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="48 requests, tiny model (default 160)")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--model", choices=["embedded", "tiny"], help="default: tiny if --quick")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-requests", type=int, help="override the request count")
    p.add_argument("--seed", type=int, default=0)
    experiment = p.add_argument_group("experiments (not the default app)")
    experiment.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=lambda kv: tuple(kv.split("=", 1)),
        help="env for Ray's processes, e.g. RAY_SERVE_THROUGHPUT_OPTIMIZED=1",
    )
    return p.parse_args()


def prepare_model(name: str, tmp: str) -> Path:
    from serving.model_source import resolve_model_dir
    from serving.tiny_models import save_tiny_model_dir

    if name == "tiny":
        return save_tiny_model_dir(Path(tmp) / "tiny", **TINY)
    return resolve_model_dir("embedded")


def main() -> None:
    args = parse_args()
    n = args.num_requests or (48 if args.quick else 160)
    name = args.model or ("tiny" if args.quick else "embedded")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serve_overhead_") as tmp:
        model_dir = prepare_model(name, tmp)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        reqs = c.sample_requests(n, args.seed, vocab, SCALING)
        workload = {
            "num_requests": n,
            "concurrency": args.concurrency,
            "trace": str(c.TRACE_PATH.relative_to(c.REPO_ROOT)),
            "scaling": SCALING.describe(),
            "prompt_tokens_mean": sum(len(r.prompt) for r in reqs) / n,
            "output_tokens_mean": sum(r.max_new_tokens for r in reqs) / n,
            "seed": args.seed,
            "arrivals": f"closed loop, {args.concurrency} in flight",
            "engine_config": ENGINE,
            "serve_env": dict(args.serve_env),
        }
        c.log(f"model {name} at {model_dir}; workload {workload}")
        engine_res, info = run_engine(model_dir, reqs, args.concurrency)
        served = run_serve(model_dir, reqs, args)
        results = [engine_res, *served]
    model = {"name": name, **info}  # not the folder: it is a path of this machine
    report = build_report(args, model, workload, results)
    report["total_wall_s"] = time.perf_counter() - t0
    print_report(report)
    if args.json:
        c.write_json(args.json, report)
        c.log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
