"""Automatic prefix caching: multi-turn chats and a shared long instruction, cache on
vs off, the routed hit rate of two replicas, and vLLM's CPU server with its prefix caching on.

Workloads (token ids, SmolLM2-135M-Instruct, the embedded default model, float32, one model
thread; every request greedy with ignore_eos so every system generates the same lengths):
- chat: --convs conversations x --turns turns, a shared system prompt; each turn resends the
  system prompt, the whole history (earlier user turns and the model's own replies) and a new
  user message. Closed loop: a conversation sends its next turn when its reply ends, all
  conversations at once. TTFT is measured for turns >= 2 (turn 1 has nothing to reuse).
- instruction: --inst-requests requests sharing a --inst-tokens instruction, each with its own
  short input, all submitted at once (a Batch API file).

tideserve runs in this process (LLMEngine driven step by step: no HTTP); vLLM is its
OpenAI server on 127.0.0.1 (streaming /v1/completions with token-id prompts), started and
stopped here, so its TTFT also holds an HTTP hop (a few ms against prefills of 100s of ms).

Routing: a simulation (stated in the result file). The chat's requests, in the order the
engine ran them, are routed by the PrefixAffinityRouter's pure choice (serving/llm/router.py)
to two simulated replicas, each a BlockPool of the engine's size with prefix caching; the hit
rate is compared with one replica serving everything, and with round-robin as a reference.

    python benchmarks/prefix_cache.py --quick --json benchmarks/results/prefix_cache_quick.json

vLLM's interpreter: --vllm-python, else $TIDESERVE_VLLM_PYTHON, else .venv-vllm beside the venv
running this script (the lead's layout: .venv and .venv-vllm side by side).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import log, machine_info, write_json
from common.stats import percentile

SEED = 34
VLLM_LOG = Path(tempfile.gettempdir()) / "prefix_cache_vllm.log"


def simd_flags() -> list[str]:
    """The CPU's vector flags that decide kernel speed (AVX2, FMA, AVX-512*, AMX)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))


def default_vllm_python() -> str:
    env = os.environ.get("TIDESERVE_VLLM_PYTHON")
    return env or str(Path(sys.executable).parents[2] / ".venv-vllm" / "bin" / "python")


# ----- workloads ----------------------------------------------------------------------------------
def chat_workload(convs: int, turns: int, system_tokens: int, user_tokens: int, vocab: int):
    rng = random.Random(SEED)
    system = [rng.randrange(100, vocab) for _ in range(system_tokens)]
    users = [
        [
            [rng.randrange(100, vocab) for _ in range(rng.randint(user_tokens // 2, user_tokens))]
            for _ in range(turns)
        ]
        for _ in range(convs)
    ]
    return system, users


def instruction_workload(n: int, inst_tokens: int, vocab: int):
    rng = random.Random(SEED + 1)
    inst = [rng.randrange(100, vocab) for _ in range(inst_tokens)]
    return [inst + [rng.randrange(100, vocab) for _ in range(rng.randint(8, 24))] for _ in range(n)]


# ----- tideserve, in process ----------------------------------------------------------------------
def make_engine(model_dir: str, caching: bool, num_kv_blocks: int):
    from serving.engine import EngineConfig, LLMEngine

    cfg = EngineConfig(
        prefix_caching=caching, num_kv_blocks=num_kv_blocks, max_num_seqs=64, min_num_seqs=64
    )
    return LLMEngine.from_pretrained(model_dir, cfg)


def run_chat_engine(engine, system, users, max_tokens: int) -> dict:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    history = [list(system) for _ in users]
    turn = [0] * len(users)
    owner: dict[str, int] = {}
    replies: list[list[list[int]]] = [[] for _ in users]
    ttft: list[tuple[int, float]] = []
    # (prompt, reply) in submission order, for the routing simulation
    order: list[tuple[list[int], list[int]]] = []
    entry: dict[str, tuple[list[int], list[int]]] = {}

    def submit(c: int) -> None:
        history[c] += users[c][turn[c]]
        order.append((list(history[c]), []))
        rid = engine.add_request(list(history[c]), params)
        owner[rid], entry[rid] = c, order[-1]

    t0 = time.perf_counter()
    for c in range(len(users)):
        submit(c)
    out_tokens = 0
    while engine.has_unfinished():
        for seq in engine.step():
            if not seq.finished:
                continue
            c = owner.pop(seq.request_id)
            entry.pop(seq.request_id)[1].extend(seq.output_token_ids)
            ttft.append((turn[c], seq.first_token_s - seq.arrival_s))
            replies[c].append(seq.output_token_ids)
            history[c] += seq.output_token_ids
            out_tokens += seq.num_output_tokens
            turn[c] += 1
            if turn[c] < len(users[c]):
                submit(c)
    wall = time.perf_counter() - t0
    later = [t for k, t in ttft if k >= 1]
    stats = engine.stats()
    return {
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 2),
        "ttft_p50_turns2plus_s": round(percentile(later, 50), 4),
        "ttft_p99_turns2plus_s": round(percentile(later, 99), 4),
        "ttft_p50_turn1_s": round(percentile([t for k, t in ttft if k == 0], 50), 4),
        "prefix_hit_fraction": round(stats.prefix_cache_hit_fraction, 4),
        "num_preemptions": stats.num_preemptions,
        "_replies": replies,
        "_order": order,
    }


def run_instruction_engine(engine, prompts, max_tokens: int) -> dict:
    from serving.engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    rids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, object] = {}
    while engine.has_unfinished():
        for seq in engine.step():
            if seq.finished:
                done[seq.request_id] = seq
    wall = time.perf_counter() - t0
    seqs = [done[r] for r in rids]
    ttfts = [s.first_token_s - s.arrival_s for s in seqs]
    return {
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(sum(s.num_output_tokens for s in seqs) / wall, 2),
        "ttft_p50_s": round(percentile(ttfts, 50), 4),
        "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "prefix_hit_fraction": round(engine.stats().prefix_cache_hit_fraction, 4),
        "_outputs": [s.output_token_ids for s in seqs],
    }


# ----- routing simulation -------------------------------------------------------------------------
def simulate_routing(order, num_blocks: int, block: int, system_tokens: int) -> dict:
    """Hit rates of the chat's (prompt, reply) pairs in submission order, each request's blocks
    (prompt and reply) cached when it ends, on 1 replica, 2 by prefix affinity (the default
    key length, and one that reaches past the shared system prompt), 2 round-robin; with the
    largest share of requests one replica got."""
    from serving.engine.kv_blocks import BlockPool, Refused
    from serving.engine.prefix_cache import extend_block_hashes, root_hash
    from serving.llm.prefix_affinity import AffinityBound
    from serving.llm.router import prefix_affinity_ranks

    root = root_hash("sim", "float32")

    def run(num_replicas: int, prefix_tokens: int | None) -> dict:
        bound = AffinityBound(prefix_tokens=prefix_tokens or 1)
        pools = [BlockPool(num_blocks, block) for _ in range(num_replicas)]
        for p in pools:
            p.enable_caching()
        queried = hit = 0
        counts = [0] * num_replicas
        for i, (prompt, reply) in enumerate(order):
            if prefix_tokens is None:  # round-robin
                k = i % num_replicas
            else:
                replicas = [(k, f"replica-{k}", None) for k in range(num_replicas)]
                k = prefix_affinity_ranks(prompt, replicas, bound)[0][0]
            counts[k] += 1
            pool, full, sid = pools[k], prompt + reply, f"r{i}"
            hs = extend_block_hashes([], full, block, root)
            cached = pool.match(hs, (len(prompt) - 1) // block)
            queried += len(prompt)
            hit += len(cached) * block
            pool.share(sid, cached)
            if not isinstance(pool.grow(sid, len(full)), Refused):
                pool.commit(sid, hs, len(full))
            pool.free(sid)
        return {"hit_fraction": round(hit / queried, 4), "max_share": max(counts) / len(order)}

    default = AffinityBound().prefix_tokens
    one = run(1, default)
    two = run(2, default)
    past = run(2, system_tokens + 16)
    rr = run(2, None)
    return {
        "method": "simulation: the chat's prompts in the engine's submission order, routed by "
        "PrefixAffinityRouter's pure choice (serving/llm/router.py; replicas report no load, "
        "so the bound never spills) onto BlockPools of the engine's size with prefix caching; "
        "each request's blocks (prompt and reply) are cached when it ends. max_share: the "
        "largest share of requests one replica got (0.5 = even)",
        "one_replica": one,
        f"two_replicas_affinity_prefix_{default}_tokens": two,
        f"two_replicas_affinity_prefix_{system_tokens + 16}_tokens": past,
        "two_replicas_round_robin": rr,
        "affinity_over_one_default_key": round(two["hit_fraction"] / one["hit_fraction"], 4),
        "affinity_over_one_key_past_system_prompt": round(
            past["hit_fraction"] / one["hit_fraction"], 4
        ),
    }


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


# ----- main ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="model dir (default: the embedded SmolLM2)")
    ap.add_argument("--convs", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=192)
    ap.add_argument("--user-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--inst-requests", type=int, default=24)
    ap.add_argument("--inst-tokens", type=int, default=512)
    ap.add_argument("--num-kv-blocks", type=int, default=1536)
    ap.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--vllm-port", type=int, default=8934)
    ap.add_argument("--vllm-python", default=default_vllm_python())
    args = ap.parse_args()
    # A timeout's SIGTERM unwinds like an error, so the vLLM server started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.convs, args.turns, args.inst_requests = 6, 3, 8
    torch.set_num_threads(1)  # one model thread, as vLLM's CPU build is given here
    if args.model is None:
        from serving.model_source import embedded_model_dir

        args.model = str(embedded_model_dir())
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    system, users = chat_workload(
        args.convs, args.turns, args.system_tokens, args.user_tokens, vocab
    )
    prompts = instruction_workload(args.inst_requests, args.inst_tokens, vocab)
    report: dict = {
        "benchmark": "prefix_cache",
        "machine": {**machine_info("cpu", "float32"), "cpu_flags": simd_flags()},
        # paths name a machine: the model by its folder's name, vLLM's interpreter not at all
        "args": {**vars(args), "model": Path(args.model).name, "vllm_python": "(local)"},
        "notes": "tideserve in process (LLMEngine, no HTTP); vLLM over HTTP on 127.0.0.1",
    }
    chat, inst = {}, {}
    for caching in (False, True):
        name = "on" if caching else "off"
        engine = make_engine(args.model, caching, args.num_kv_blocks)
        log(f"chat, cache {name}")
        chat[name] = run_chat_engine(engine, system, users, args.max_tokens)
        engine = make_engine(args.model, caching, args.num_kv_blocks)
        log(f"instruction, cache {name}")
        inst[name] = run_instruction_engine(engine, prompts, args.max_tokens)
        del engine
    block = 16
    routing = simulate_routing(chat["on"]["_order"], args.num_kv_blocks, block, args.system_tokens)
    same_chat = chat["on"].pop("_replies") == chat["off"].pop("_replies")
    same_inst = inst["on"].pop("_outputs") == inst["off"].pop("_outputs")
    chat["on"].pop("_order"), chat["off"].pop("_order")
    report["chat"] = {
        "tideserve_cache_off": chat["off"],
        "tideserve_cache_on": chat["on"],
        "ttft_p50_turns2plus_on_over_off": round(
            chat["on"]["ttft_p50_turns2plus_s"] / chat["off"]["ttft_p50_turns2plus_s"], 4
        ),
        "output_tokens_per_s_on_over_off": round(
            chat["on"]["output_tokens_per_s"] / chat["off"]["output_tokens_per_s"], 4
        ),
        "greedy_outputs_identical": same_chat,
    }
    report["instruction"] = {
        "tideserve_cache_off": inst["off"],
        "tideserve_cache_on": inst["on"],
        "ttft_p50_on_over_off": round(inst["on"]["ttft_p50_s"] / inst["off"]["ttft_p50_s"], 4),
        "output_tokens_per_s_on_over_off": round(
            inst["on"]["output_tokens_per_s"] / inst["off"]["output_tokens_per_s"], 4
        ),
        "greedy_outputs_identical": same_inst,
    }
    report["routing"] = routing
    if args.json:
        write_json(args.json, report)  # what is measured so far, should vLLM fail
    if args.vllm:
        try:
            report["chat"].update(run_vllm_side(args, system, users, chat["on"]))
        except (RuntimeError, OSError) as err:
            report["chat"]["vllm_error"] = str(err)
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=2))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
