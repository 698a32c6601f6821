"""Third-party load clients against the Serve app on 127.0.0.1: guidellm and locust.

    bash scripts/install_load_tools.sh            # once: .venv-load with guidellm and locust
    python benchmarks/load_test.py [--quick] [--json PATH] [--tools guidellm,locust]

Both tools run as subprocesses from .venv-load (their pins would move the serving stack's).
guidellm: constant-rate streaming completions with synthetic prompts, token counts from the
model directory's own tokenizer (offline, nothing downloaded). locust: closed-loop users,
headless, with TTFT and inter-token latency rows from benchmarks/locustfile.py.
Reported per tool: TTFT, inter-token latency, request latency percentiles and throughput.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import start_local_ray, write_json  # noqa: E402

PORT, APP = 18740, "loadtest"
LOAD_BIN = ROOT / ".venv-load" / "bin"
MAX_TOKENS, PROMPT_TOKENS = 32, 32


def app_args(model_dir: Path) -> dict:
    from tests.integration.serve_helpers import app_args as base

    return base(
        model_dir,
        engine={"max_model_len": 256, "max_num_seqs": 8, "min_num_seqs": 8},
        tiers={"interactive": {"max_waiting": 32, "ttft_p99_s": 5.0}},
    )


def run_guidellm(base: str, model_dir: Path, out: Path, duration_s: float, rate_rps: float):
    cmd = [
        str(LOAD_BIN / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={base},model=tiny,request_format=/v1/completions",
        "--profile", f"kind=constant,rate={rate_rps}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={MAX_TOKENS}",
        "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
        "--constraint", f"kind=max_duration,seconds={duration_s}",
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=duration_s + 300)
    if proc.returncode != 0:
        raise RuntimeError(f"guidellm failed: {proc.stderr[-3000:]}{proc.stdout[-2000:]}")
    return summarize_guidellm(json.loads(out.read_text())), proc.stdout[-4000:]


def summarize_guidellm(report: dict) -> dict:
    """The metrics block of guidellm's first benchmark: successful requests' distributions."""
    bench = report["benchmarks"][0]
    metrics = bench["metrics"]

    def dist(name: str, scale: float = 1.0) -> dict:
        d = metrics[name]["successful"]
        pct = d.get("percentiles", {})
        return {
            "mean": d["mean"] * scale,
            "p50": pct.get("p50", d.get("median", 0.0)) * scale,
            "p95": pct.get("p95", 0.0) * scale,
            "p99": pct.get("p99", 0.0) * scale,
        }

    totals = metrics["request_totals"]
    return {
        "requests": {k: totals[k] for k in ("successful", "errored", "incomplete") if k in totals},
        "ttft_ms": dist("time_to_first_token_ms"),
        "inter_token_latency_ms": dist("inter_token_latency_ms"),
        "request_latency_s": dist("request_latency"),
        "requests_per_s": metrics["requests_per_second"]["successful"]["mean"],
        "output_tokens_per_s": metrics["output_tokens_per_second"]["successful"]["mean"],
    }


def run_locust(base: str, prefix: Path, duration_s: float, users: int) -> dict:
    cmd = [
        str(LOAD_BIN / "locust"), "-f", str(ROOT / "benchmarks" / "locustfile.py"),
        "--headless", "-u", str(users), "-r", str(users), "-t", f"{int(duration_s)}s",
        "--host", base, "--csv", str(prefix), "--only-summary", "--exit-code-on-error", "0",
    ]  # fmt: skip
    env = {**os.environ, "LOAD_MODEL": "tiny", "LOAD_MAX_TOKENS": str(MAX_TOKENS)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=duration_s + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"locust failed: {proc.stderr[-3000:]}")
    with open(f"{prefix}_stats.csv", newline="") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}

    def row(name: str) -> dict:
        r = rows[name]
        return {
            "count": int(r["Request Count"]),
            "failures": int(r["Failure Count"]),
            "p50_ms": float(r["50%"]),
            "p95_ms": float(r["95%"]),
            "p99_ms": float(r["99%"]),
            "mean_ms": float(r["Average Response Time"]),
            "per_s": float(r["Requests/s"]),
        }

    request = row("completion")  # counts, failures, rate; its times stop at the headers
    return {
        "users": users,
        "requests": {"count": request["count"], "failures": request["failures"]},
        "request_latency": row("e2e"),
        "ttft": row("ttft"),
        "inter_token_latency": row("itl"),
        "requests_per_s": request["per_s"],
        "output_tokens_per_s": request["per_s"] * MAX_TOKENS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--tools", default="guidellm,locust")
    args = parser.parse_args()
    if not (LOAD_BIN / "guidellm").exists():
        sys.exit("run `bash scripts/install_load_tools.sh` first (.venv-load is missing)")
    import ray
    from ray import serve

    from serving.tiny_models import SMALL_LLAMA, save_tiny_model_dir
    from tests.integration.serve_helpers import deploy

    duration_s = 15.0 if args.quick else 60.0
    start_local_ray()
    report: dict = {"benchmark": "load_test", "quick": args.quick, "duration_s": duration_s}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model_dir(Path(tmp) / "small", **SMALL_LLAMA)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        deploy(app_args(model_dir), APP, "/")
        base = f"http://127.0.0.1:{PORT}"
        report["started_unix_s"] = time.time()
        if "guidellm" in args.tools:
            out = Path(tmp) / "guidellm.json"
            report["guidellm"], tail = run_guidellm(base, model_dir, out, duration_s, 4.0)
            report["guidellm"]["rate_rps"] = 4.0
            print(tail)
        if "locust" in args.tools:
            report["locust"] = run_locust(base, Path(tmp) / "locust", duration_s, users=8)
        serve.shutdown()
    ray.shutdown()
    print(json.dumps(report, indent=2))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
