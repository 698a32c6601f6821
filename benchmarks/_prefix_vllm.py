"""vLLM's CPU server for the prefix-cache benchmark (benchmarks/prefix_cache.py): started with its
prefix caching on, sent the same chats over HTTP (streaming /v1/completions with token-id
prompts, one thread per conversation), stopped."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks._common import log
from common.stats import percentile

VLLM_LOG = Path(tempfile.gettempdir()) / "prefix_cache_vllm.log"


def default_vllm_python() -> str:
    """--vllm-python's default: $TIDESERVE_VLLM_PYTHON, else .venv-vllm beside the venv running
    the benchmark (the lead's layout: .venv and .venv-vllm side by side)."""
    env = os.environ.get("TIDESERVE_VLLM_PYTHON")
    return env or str(Path(sys.executable).parents[2] / ".venv-vllm" / "bin" / "python")


# ----- vLLM's CPU server --------------------------------------------------------------------------
def start_vllm(python: str, model_dir: str, port: int, timeout_s: float) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="0")
    env.pop("PYTHONPATH", None)
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--dtype", "float32", "--max-model-len", "2048", "--port", str(port),
        "--host", "127.0.0.1", "--enable-prefix-caching", "--max-num-seqs", "64",
    ]  # fmt: skip
    with open(VLLM_LOG, "w") as errors:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}; see {VLLM_LOG}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(1.0)
    stop(proc)
    raise RuntimeError(f"vLLM not ready after {timeout_s} s; see {VLLM_LOG}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def vllm_complete(port: int, model: str, prompt: list[int], max_tokens: int):
    """One streamed greedy completion: (ttft_s, token ids)."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "return_token_ids": True,
    })  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"vLLM answered {resp.status}: {resp.read()[:300]!r}")
    first, tokens = None, []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        if first is None and choice.get("text") is not None:
            first = time.perf_counter() - t0
        tokens += choice.get("token_ids") or []
    return first, tokens


def run_chat_vllm(port: int, model: str, system, users, max_tokens: int) -> dict:
    ttft: list[tuple[int, float]] = []
    lock = threading.Lock()
    counted, short = [0], [0]  # tokens received; replies shorter than asked (none expected)

    def conversation(c: int) -> None:
        history = list(system)
        for t, user in enumerate(users[c]):
            history += user
            first, tokens = vllm_complete(port, model, history, max_tokens)
            history += tokens
            with lock:
                ttft.append((t, first))
                counted[0] += len(tokens)
                short[0] += len(tokens) != max_tokens

    t0 = time.perf_counter()
    threads = [threading.Thread(target=conversation, args=(c,)) for c in range(len(users))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    later = [t for k, t in ttft if k >= 1]
    return {
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(counted[0] / wall, 2),
        "ttft_p50_turns2plus_s": round(percentile(later, 50), 4),
        "ttft_p99_turns2plus_s": round(percentile(later, 99), 4),
        "ttft_p50_turn1_s": round(percentile([t for k, t in ttft if k == 0], 50), 4),
        "client": "HTTP, one thread per conversation, streaming /v1/completions",
        "num_replies_not_max_tokens": short[0],
    }


def run_vllm_side(args, system, users, ours: dict) -> dict:
    log("vLLM: starting")
    proc = start_vllm(args.vllm_python, args.model, args.vllm_port, 300)
    try:
        log("vLLM: chat")
        v = run_chat_vllm(args.vllm_port, args.model, system, users, args.max_tokens)
    finally:
        stop(proc)
    return {
        "vllm_prefix_caching_on": v,
        "ttft_p50_turns2plus_tideserve_over_vllm": round(
            ours["ttft_p50_turns2plus_s"] / v["ttft_p50_turns2plus_s"], 4
        ),
    }
