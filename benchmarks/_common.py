"""Shared benchmark helpers: trace sampling, a tiny random Llama, timing results, reporting."""

from __future__ import annotations

import csv
import gzip
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.stats import percentile
from serving.tiny_models import SMALL_LLAMA

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = REPO_ROOT / "benchmarks" / "traces"  # see its README for sources and licences
TRACE_PATH = TRACES_DIR / "azure_llm_2023_conv.csv.gz"
_T0 = time.perf_counter()

MODEL_CONFIG = dict(
    vocab_size=512,
    **SMALL_LLAMA,
    initializer_range=0.2,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
)


def log(msg: str) -> None:
    """A progress line on stderr, stamped with seconds since the process started."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Scaling:
    divisor: int = 8
    max_prompt: int = 512
    max_output: int = 128

    def apply(self, context: int, generated: int) -> tuple[int, int]:
        prompt = min(max(round(context / self.divisor), 1), self.max_prompt)
        output = min(max(round(generated / self.divisor), 1), self.max_output)
        return prompt, output

    def describe(self) -> str:
        return (
            f"prompt = clip(round(ContextTokens / {self.divisor}), 1, {self.max_prompt}); "
            f"output = clip(round(GeneratedTokens / {self.divisor}), 1, {self.max_output})"
        )


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_new_tokens: int


def open_trace(path: str | os.PathLike):
    """A trace CSV (plain or .gz) as text; a missing file is an error saying where traces live."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"trace {path} not found; the traces ship in {TRACES_DIR} (see its README.md for "
            "their sources), or pass another file with --trace"
        )
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")


def sample_requests(
    n: int, seed: int, vocab_size: int, scaling: Scaling, path: Path = TRACE_PATH
) -> list[Request]:
    """`n` trace rows drawn without replacement (fixed seed), scaled, with random prompt ids."""
    with open_trace(path) as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    rng = random.Random(seed)
    picked = rng.sample(rows, n)
    reqs = []
    for context, generated in picked:
        prompt_len, output_len = scaling.apply(context, generated)
        prompt = [rng.randrange(3, vocab_size) for _ in range(prompt_len)]
        reqs.append(Request(prompt, output_len))
    return reqs


def build_model(seed: int, dtype: torch.dtype, device: str):
    """A random-weight Llama of a few million parameters (no download)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(**MODEL_CONFIG)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.to(device).eval()


@dataclass
class RunResult:
    """One system's measured run. Times are seconds since that system's start."""

    name: str
    wall_s: float
    num_tokens: int
    latencies: list[float]
    ttfts: list[float]
    outputs: list[list[int]] = field(default_factory=list)
    notes: str = ""
    extra: dict = field(default_factory=dict)  # system-specific numbers, kept out of summary()

    def summary(self) -> dict:
        out = {
            "name": self.name,
            "tokens_per_s": self.num_tokens / self.wall_s,
            "latency_p50_s": percentile(self.latencies, 50),
            "latency_p99_s": percentile(self.latencies, 99),
            "ttft_p50_s": percentile(self.ttfts, 50),
            "ttft_p99_s": percentile(self.ttfts, 99),
            "wall_s": self.wall_s,
            "num_requests": len(self.latencies),
            "generated_tokens": self.num_tokens,
        }
        if self.notes:
            out["notes"] = self.notes
        return out


class FirstTokenTimer:
    """A `generate()` streamer: its first put() is the prompt, the second the first new token."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    """a[key] / b[key] between two system summaries; None when either system is missing."""
    return a[key] / b[key] if a and b and b[key] else None


def cpu_model() -> str:
    """The CPU's model name: runs on differently shaped machines must say which they ran on."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: str, dtype: str) -> dict:
    import transformers

    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "dtype": dtype,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def format_table(systems: list[dict]) -> str:
    head = f"{'system':<20} {'reqs':>5} {'tok/s':>9} {'wall s':>8} "
    head += f"{'lat p50':>8} {'lat p99':>8} {'ttft p50':>9} {'ttft p99':>9}"
    lines = [head, "-" * len(head)]
    for s in systems:
        lines.append(
            f"{s['name']:<20} {s['num_requests']:>5} {s['tokens_per_s']:>9.1f} "
            f"{s['wall_s']:>8.2f} {s['latency_p50_s']:>8.2f} {s['latency_p99_s']:>8.2f} "
            f"{s['ttft_p50_s']:>9.2f} {s['ttft_p99_s']:>9.2f}"
        )
    return "\n".join(lines)


def step_stats(step_log) -> dict:
    """Host overhead: the share of step time spent outside the model forward."""
    steps = list(step_log)
    big = [s for s in steps if s.num_seqs >= 16]

    def outside(rows) -> float | None:
        total = sum(s.step_s for s in rows)
        return sum(s.step_s - s.forward_s for s in rows) / total if total else None

    return {
        "outside_forward_fraction": outside(big),
        "outside_forward_fraction_all": outside(steps),
        "mean_batch_size": sum(s.num_seqs for s in steps) / len(steps) if steps else None,
        "num_steps": len(steps),
        "num_steps_batch_ge_16": len(big),
    }


def print_report(report: dict) -> None:
    def fmt(d: dict) -> str:
        return ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items()
        )

    print(format_table(report["systems"]))
    print("ratios: " + fmt(report["ratios"]))
    print("targets: " + fmt(report["targets"]))
    keys = ("outside_forward_fraction", "outside_forward_fraction_all", "mean_batch_size")
    print(fmt({k: report[k] for k in (*keys, "num_steps", "outputs_match")}))


def start_local_ray() -> None:
    """A private local Ray cluster for one benchmark: 2 CPUs, no dashboard, bound to 127.0.0.1.

    address="local" so a benchmark never attaches to another cluster running on the machine.
    """
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )


def write_json(path: str | os.PathLike, obj: dict) -> None:
    """The one writer of benchmark results: indented JSON, parent folders created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


# ----- online (streaming) clients: closed-loop driving and per-process CPU accounting ----------
@dataclass
class Mark:
    """One streamed request's timing: call token() when a chunk with new tokens arrives."""

    start: float
    first: float | None = None
    chunks: int = 0

    def token(self) -> None:
        self.chunks += 1
        if self.first is None:
            self.first = time.perf_counter()


async def closed_loop(name: str, reqs: list[Request], one, concurrency: int) -> RunResult:
    """Run every request through `await one(req, mark) -> tokens generated`, `concurrency` in
    flight (the next starts when one ends). Latency and TTFT are from each request's own start;
    extra["tokens_per_chunk"] is tokens / chunks that carried tokens. Raises if any request
    generated other than its max_new_tokens."""
    import asyncio

    sem, n = asyncio.Semaphore(concurrency), len(reqs)
    lat, ttft, counts, chunks = [0.0] * n, [0.0] * n, [0] * n, [0] * n

    async def task(i: int, req: Request) -> None:
        async with sem:
            mark = Mark(time.perf_counter())
            counts[i] = await one(req, mark)
            end = time.perf_counter()
            lat[i], ttft[i] = end - mark.start, (mark.first or end) - mark.start
            chunks[i] = mark.chunks

    t0 = time.perf_counter()
    await asyncio.gather(*(task(i, r) for i, r in enumerate(reqs)))
    wall = time.perf_counter() - t0
    for i, r in enumerate(reqs):
        if counts[i] != r.max_new_tokens:
            raise RuntimeError(f"{name}: request {i} got {counts[i]}/{r.max_new_tokens} tokens")
    res = RunResult(name, wall, sum(counts), lat, ttft)
    res.extra["tokens_per_chunk"] = sum(counts) / max(sum(chunks), 1)
    return res


def process_role(cmdline: list[str], is_self: bool) -> str:
    """A Ray process's role from its title: replica_<deployment>, proxy, controller, raylet..."""
    if is_self:
        return "client"
    cmd = " ".join(cmdline)
    if "ServeReplica:" in cmd:  # "ray::ServeReplica:<app>:<deployment>[.<method>]"
        return "replica_" + cmd.split("ServeReplica:", 1)[1].split(":")[1].split(".")[0].strip()
    roles = {"ProxyActor": "proxy", "ServeController": "controller"}
    roles |= {"gcs_server": "gcs_server", "raylet": "raylet"}
    return next((role for key, role in roles.items() if key in cmd), "ray_other")


def cpu_snapshot() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants (a local Ray cluster's), by role;
    `_machine` is the whole machine's busy CPU seconds."""
    import psutil

    me = psutil.Process()
    out: dict[str, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            role, t = process_role(proc.cmdline(), proc.pid == me.pid), proc.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    m = psutil.cpu_times()
    out["_machine"] = sum(m) - m.idle - getattr(m, "iowait", 0.0)
    return out


def cpu_used(before: dict[str, float], after: dict[str, float]) -> tuple[dict[str, float], float]:
    """CPU seconds per role between two snapshots (largest first), and the machine's busy
    seconds outside those processes (other jobs on the machine)."""
    used = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if k != "_machine"}
    foreign = after["_machine"] - before["_machine"] - sum(used.values())
    return dict(sorted(used.items(), key=lambda kv: -kv[1])), round(foreign, 2)
