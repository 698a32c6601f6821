"""The prepared GPU check (benchmarks/gpu_suite.sh runs it): tests/gpu, then the engine against
transformers' continuous batching (what `generate_batch` runs) and static batching in bfloat16 on
random-weight models at real shapes, then `capacity calibrate`, all into one JSON.

    python benchmarks/gpu_suite.py [--quick] [--json PATH] [--device cuda|cpu] [--shapes a,b]

Needs only torch and transformers (and pytest for tests/gpu, skipped without it): no Ray, no
weights, no network. Models are built from configs with random weights (SmolLM2-135M,
Llama-3.2-1B and Llama-3-8B shapes); EOS is ignored, so every system generates exactly the
requested tokens. `--device cpu --quick --shapes tiny` is the CPU smoke run of the same code.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks import _common as c

SHAPES = {  # from the models' published config.json files
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         tie_word_embeddings=True, rope_theta=500000.0),
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       tie_word_embeddings=False, rope_theta=500000.0),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}  # fmt: skip
ENGINE = dict(max_num_seqs=64, min_num_seqs=16, max_num_batched_tokens=2048, block_size_tokens=16)


def build(shape: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=4096, **SHAPES[shape])
    with torch.device(device):  # random init on the GPU: seconds, not minutes, for 8B
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def requests(n: int, vocab: int, prompt_max: int, out_tokens: int) -> list[c.Request]:
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(prompt_max // 4, prompt_max + 1, (n,), generator=g).tolist()
    return [
        c.Request(torch.randint(3, vocab, (k,), generator=g).tolist(), out_tokens) for k in lens
    ]


def run_engine(
    model, reqs: list[c.Request], kv_bytes: int, decode_attention: str = "auto"
) -> c.RunResult:
    from benchmarks.engine_throughput import _drive_engine
    from serving.engine import EngineConfig, LLMEngine

    cfg = EngineConfig(kv_cache_bytes=kv_bytes, decode_attention=decode_attention, **ENGINE)
    eng = LLMEngine(model, config=cfg)
    c.log(f"engine decode attention: {eng.runner.decode_attention} (asked: {decode_attention})")
    _drive_engine(eng, reqs[:2])  # warm-up
    wall, first, done, seqs = _drive_engine(eng, reqs)
    order = range(len(reqs))
    outputs = [seqs[i].output_token_ids for i in order]
    name = "tideserve" if decode_attention == "auto" else f"tideserve_{decode_attention}"
    res = c.RunResult(name, wall, sum(map(len, outputs)), [done[i] for i in order],
                      [first[i] for i in order], outputs)  # fmt: skip
    model.set_attn_implementation("sdpa")  # give the model back for the other systems
    return res


def bench_shape(shape: str, args) -> dict:
    from benchmarks.engine_throughput import run_hf_batches, run_transformers_cb

    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    model = build(shape, dtype, args.device)
    params = sum(p.numel() for p in model.parameters())
    n, prompt_max, out = (32, 256, 64) if args.quick else (128, 512, 128)
    reqs = requests(n, SHAPES[shape]["vocab_size"], prompt_max, out)
    kv_bytes = 2 * 2**30 if args.device == "cpu" else 16 * 2**30
    results, failed = {}, {}
    plan = {
        "tideserve": lambda: run_engine(model, reqs, kv_bytes),  # auto: flex on CUDA
        "tideserve_gather": lambda: run_engine(model, reqs, kv_bytes, "gather"),
        "transformers_cb": lambda: run_transformers_cb("transformers_cb", model, reqs, 64),
        "static_batch_32": lambda: run_hf_batches("static_batch_32", model, reqs, 32),
    }
    for name, fn in plan.items():
        try:
            results[name] = fn()
            c.log(f"{shape} {name}: {results[name].num_tokens / results[name].wall_s:.0f} tok/s")
        except Exception as err:  # one failing system must not hide the others
            failed[name] = f"{type(err).__name__}: {err}"
            c.log(f"{shape} {name}: FAILED {failed[name]}")
    s = {k: r.summary() for k, r in results.items()}
    ours = s.get("tideserve")
    return {
        "params": params,
        "workload": {
            "num_requests": n,
            "prompt_tokens": [prompt_max // 4, prompt_max],
            "output_tokens": out,
            "dtype": args.dtype,
        },
        "systems": s,
        "failed": failed,
        "ratio_vs_transformers_cb": c.ratio(ours, s.get("transformers_cb"), "tokens_per_s"),
        "ratio_vs_static_batch_32": c.ratio(ours, s.get("static_batch_32"), "tokens_per_s"),
        "ratio_auto_vs_gather_decode": c.ratio(ours, s.get("tideserve_gather"), "tokens_per_s"),
        "seconds": time.perf_counter() - t0,
    }


def run_tests(timeout_s: int) -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed on this machine"}
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/gpu", "-p", "no:cacheprovider"]
    try:
        p = subprocess.run(cmd, cwd=c.REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"returncode": None, "tail": f"timed out after {timeout_s} s"}
    return {"returncode": p.returncode, "tail": (p.stdout + p.stderr)[-3000:]}


def run_calibrate(args) -> dict:
    from capacity.calibrate import calibrate

    with tempfile.TemporaryDirectory() as tmp:
        shape = "tiny" if args.device == "cpu" else "smollm2-135m"
        model = build(shape, torch.float32, "cpu")
        model.save_pretrained(tmp)
        grid = dict(batch_sizes=(1, 8, 32), context_lens=(64, 512), decode_steps=8)
        try:
            profile = calibrate(tmp, num_threads=None, verbose=False, **grid)
        except Exception as err:
            return {"failed": f"{type(err).__name__}: {err}"}
        return {"model_shape": shape, "profile": profile.to_dict(with_points=False)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="32 requests of 64 tokens per shape")
    p.add_argument("--json", metavar="PATH", default="gpu_suite.json")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b,llama-3-8b")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    t0 = time.perf_counter()
    report = {"benchmark": "gpu_suite", "machine": c.machine_info(args.device, args.dtype)}
    report["tests_gpu"] = run_tests(180)
    c.log(f"tests/gpu: {report['tests_gpu'].get('returncode', 'skipped')}")
    report["shapes"] = {}
    for shape in args.shapes.split(","):
        report["shapes"][shape] = bench_shape(shape, args)
        gc.collect()  # the shape's model and KV cache go before the next shape's are built
        if args.device == "cuda":
            torch.cuda.empty_cache()
    report["calibrate"] = run_calibrate(args)
    report["total_s"] = time.perf_counter() - t0
    c.write_json(args.json, report)
    c.log(f"wrote {args.json} in {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
