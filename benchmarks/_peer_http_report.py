"""The report of benchmarks/peer_http.py: each system's summary, the ratios against vLLM,
transformers serve and the engine in-process, the targets they are judged by, and the machine."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import _common as c

TARGETS = {
    "tokens_per_s_vs_vllm": 1.0,
    "engine_tokens_per_s_vs_vllm": 1.0,
    "tokens_per_s_vs_transformers": 1.5,
    "http_vs_engine_tokens_per_s": 0.85,
}


def config_name(path: str) -> str:
    """The config as the repository names it (results never record a machine's own paths)."""
    p = Path(path).resolve()
    return str(p.relative_to(c.REPO_ROOT)) if p.is_relative_to(c.REPO_ROOT) else p.name


def http_ceiling(ours: dict | None) -> float | None:
    """(cores - idle background cores) / cores: HTTP/engine's bound before any request's cost."""
    if not ours or "idle_background" not in ours:
        return None
    cores = os.cpu_count() or 1
    return round((cores - ours["idle_background"]["cores"]) / cores, 3)


def machine(dtype: str, engine_threads: int) -> dict:
    """c.machine_info plus the CPU flags that decide the kernels (AVX2 / AVX-512 / BF16 / AMX)."""
    from serving.engine import dtypes

    info = c.machine_info("cpu", dtype)
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    info["cpu_flags"] = sorted(f for f in dtypes.read_cpu_flags() if f in wanted)
    info["torch_threads"] = engine_threads  # the engine system's; each server's own are its own
    return info


def build_report(args, dtype: str, results: dict[str, c.RunResult], notes: str) -> dict:
    """The result file: each system's summary, the ratios against the peers and the targets."""
    s = {k: {**r.summary(), **r.extra} for k, r in results.items()}
    ours, peer, eng = s.get("tideserve"), s.get("transformers"), s.get("engine")
    vllm = s.get("vllm")
    ratios = {
        "tokens_per_s_vs_vllm": c.ratio(ours, vllm, "tokens_per_s"),
        "ttft_p99_vs_vllm": c.ratio(ours, vllm, "ttft_p99_s"),
        "engine_tokens_per_s_vs_vllm": c.ratio(eng, vllm, "tokens_per_s"),
        "tokens_per_s_vs_transformers": c.ratio(ours, peer, "tokens_per_s"),
        "http_vs_engine_tokens_per_s": c.ratio(ours, eng, "tokens_per_s"),
        "ttft_p50_vs_transformers": c.ratio(ours, peer, "ttft_p50_s"),
        "ttft_p99_vs_transformers": c.ratio(ours, peer, "ttft_p99_s"),
        "http_vs_engine_ceiling": http_ceiling(ours),
    }
    for name in s:  # layout variants of tideserve against the shipped config and vLLM
        if name.startswith("tideserve_"):
            ratios[f"{name}_tokens_per_s_vs_vllm"] = c.ratio(s[name], vllm, "tokens_per_s")
            ratios[f"{name}_tokens_per_s_vs_tideserve"] = c.ratio(s[name], ours, "tokens_per_s")
    met = {k: v is not None and v >= TARGETS[k] for k, v in ratios.items() if k in TARGETS}
    met["ttft_p99_no_worse_than_vllm"] = ratios["ttft_p99_vs_vllm"] is not None and (
        ratios["ttft_p99_vs_vllm"] <= 1.0
    )
    return {
        "benchmark": "peer_http",
        "machine": machine(dtype, args.engine_threads),
        "workload": {
            "num_requests": args.num_requests,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "config": config_name(args.config),
            "peer_dtype": dtype,
            "engine_threads": args.engine_threads,
        },
        "systems": s,
        "ratios": ratios,
        "targets": TARGETS,
        "targets_met": met,
        "notes": notes,
    }
