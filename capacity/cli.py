"""`python -m capacity plan ...`: the capacity planner from the command line (MISSION R6).

Only a model's config.json is read (json.load), never its weights: MODEL is a model directory, a
config.json path, or a hub id whose config.json is already in the local Hugging Face cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from capacity.planner import PlanInputs, format_plan, plan


def load_model_config(model: str) -> dict[str, Any]:
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        if Path(model).expanduser().exists() or model.endswith(".json"):
            raise ValueError(f"--model {model!r}: no config.json at {path}")
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json")
        if not isinstance(cached, str):
            raise ValueError(
                f"--model {model!r} is not a directory or config.json, and its config.json is "
                "not in the local Hugging Face cache (download it, or pass a path)"
            )
        path = Path(cached)
    with path.open() as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    return config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m capacity")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="memory budget, roofline throughput and replicas at peak")
    p.add_argument("--model", required=True, help="model dir, config.json, or cached hub id")
    p.add_argument("--gpu", required=True, help="catalogue GPU, e.g. H100-SXM, h100, L4")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--avg-input", type=int, required=True, help="average input tokens")
    p.add_argument("--avg-output", type=int, required=True, help="average output tokens")
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--peak-qps", type=float, required=True)
    p.add_argument("--ttft-p99", type=float, default=None, help="TTFT P99 target, seconds")
    p.add_argument("--safety", type=float, default=0.8)
    p.add_argument("--hot-fraction", type=float, default=0.7)
    p.add_argument("--utilization", type=float, default=0.9, help="device memory fraction")
    p.add_argument(
        "--effective-utilization",
        type=float,
        default=None,
        help="throughput derating (R6); defaults to --utilization",
    )
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    p.add_argument("--reserve-gib", type=float, default=None, help="default 2 GiB + 5%% of device")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        inputs = PlanInputs(
            model_config=load_model_config(args.model),
            gpu=args.gpu,
            dtype=args.dtype,
            avg_input_tokens=args.avg_input,
            avg_output_tokens=args.avg_output,
            max_model_len=args.max_model_len,
            peak_qps=args.peak_qps,
            ttft_p99_s=args.ttft_p99,
            safety=args.safety,
            utilization=args.utilization,
            effective_utilization=args.effective_utilization,
            hot_fraction=args.hot_fraction,
            block_size_tokens=args.block_size,
            reserve_bytes=None if args.reserve_gib is None else int(args.reserve_gib * 1024**3),
        )
        result = plan(inputs)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(format_plan(result))
    return 0
