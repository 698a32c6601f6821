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
Parts: benchmarks/_prefix_workloads.py (workloads, the engine side, the routing simulation),
benchmarks/_prefix_vllm.py (vLLM's server).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import log, machine_info, write_json
from benchmarks._prefix_vllm import default_vllm_python, run_vllm_side
from benchmarks._prefix_workloads import (
    chat_workload,
    instruction_workload,
    make_engine,
    run_chat_engine,
    run_instruction_engine,
    simulate_routing,
)

BLOCK_SIZE_TOKENS = 16  # EngineConfig's default, which make_engine keeps


def simd_flags() -> list[str]:
    """The CPU's vector flags that decide kernel speed (AVX2, FMA, AVX-512*, AMX)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))


def parse_args() -> argparse.Namespace:
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
    if args.quick:
        args.convs, args.turns, args.inst_requests = 6, 3, 8
    if args.model is None:
        from serving.model_source import embedded_model_dir

        args.model = str(embedded_model_dir())
    return args


def run_engines(args, system, users, prompts) -> tuple[dict, dict]:
    """The chat and the instruction workloads, cache off then on, each on a fresh engine."""
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
    return chat, inst


def compare(chat: dict, inst: dict) -> tuple[dict, dict]:
    """Cache on against off: the ratios the targets name, and whether the outputs are equal."""
    same_chat = chat["on"].pop("_replies") == chat["off"].pop("_replies")
    same_inst = inst["on"].pop("_outputs") == inst["off"].pop("_outputs")
    on, off = chat["on"], chat["off"]
    chat_report = {
        "tideserve_cache_off": off,
        "tideserve_cache_on": on,
        "ttft_p50_turns2plus_on_over_off": round(
            on["ttft_p50_turns2plus_s"] / off["ttft_p50_turns2plus_s"], 4
        ),
        "output_tokens_per_s_on_over_off": round(
            on["output_tokens_per_s"] / off["output_tokens_per_s"], 4
        ),
        "greedy_outputs_identical": same_chat,
    }
    on, off = inst["on"], inst["off"]
    inst_report = {
        "tideserve_cache_off": off,
        "tideserve_cache_on": on,
        "ttft_p50_on_over_off": round(on["ttft_p50_s"] / off["ttft_p50_s"], 4),
        "output_tokens_per_s_on_over_off": round(
            on["output_tokens_per_s"] / off["output_tokens_per_s"], 4
        ),
        "greedy_outputs_identical": same_inst,
    }
    return chat_report, inst_report


def main() -> None:
    args = parse_args()
    # A timeout's SIGTERM unwinds like an error, so the vLLM server started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.set_num_threads(1)  # one model thread, as vLLM's CPU build is given here
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
    chat, inst = run_engines(args, system, users, prompts)
    order = chat["on"].pop("_order")
    chat["off"].pop("_order")
    routing = simulate_routing(order, args.num_kv_blocks, BLOCK_SIZE_TOKENS, args.system_tokens)
    report["chat"], report["instruction"] = compare(chat, inst)
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
