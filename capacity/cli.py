"""`python -m capacity plan ...`: the capacity planner from the command line (R6 in
docs/requirements.md).

Only a model's config.json is read (json.load), never its weights: MODEL is a model directory, a
config.json path, or a hub id whose config.json is already in the local Hugging Face cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from capacity.adapters_cli import adapters_main, add_adapters_parser
from capacity.plan_outputs import add_output_args, write_plan_outputs
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


def _model_label(model: str) -> str:
    """What messages call the model: its folder (or hub id), not "config.json"."""
    path = Path(model)
    return path.parent.name if path.suffix == ".json" else (path.name or model)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m capacity", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="memory budget, roofline throughput and replicas at peak",
    )
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
    p.add_argument(
        "--max-loras",
        type=int,
        default=0,
        help="LoRA adapter slots per replica, set aside before the KV region "
        "(how many: tideserve adapters)",
    )
    p.add_argument("--max-lora-rank", type=int, default=16, help="rank of the LoRA slots")
    p.add_argument("--reserve-gib", type=float, default=None, help="default 2 GiB + 5%% of device")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_output_args(p)  # --plot, --write-cluster-yaml (capacity/plan_outputs.py)
    _add_profile_arg(p)
    _add_calibrate_parser(sub)
    add_adapters_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "calibrate":
        return _calibrate_main(args)
    if args.command == "adapters":
        return adapters_main(args)
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
            model_name=_model_label(args.model),
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
        )
        result = plan(inputs)
        as_dict = _with_profile(args, result, result.to_dict())
        text = (
            json.dumps(as_dict) if args.json else _with_profile(args, result, format_plan(result))
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    measured = as_dict.get("profile_throughput", {}).get("replica_requests_per_s")
    return write_plan_outputs(args, inputs, result, measured)


# --- calibration: `calibrate` subcommand and `plan --profile` (capacity/calibrate.py) ------------


def _add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        default=None,
        help="calibrated profile JSON (python -m capacity calibrate): throughput from measured "
        "step costs instead of the roofline",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="with --profile: sequences per replica to plan for (default: the KV region's max "
        "concurrency at the average length), e.g. the engine's max_num_seqs",
    )


def _add_calibrate_parser(sub) -> None:
    c = sub.add_parser(
        "calibrate",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="measure engine step costs on this device, save a profile",
    )
    c.add_argument("--model", required=True, help="model directory, or 'tiny' (random Llama)")
    c.add_argument("--out", default="profile.json", help="profile JSON path")
    c.add_argument("--quick", action="store_true", help="smaller grid, fewer decode steps")
    c.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")


def _calibrate_main(args: argparse.Namespace) -> int:
    from capacity.calibrate import calibrate, format_fit

    grid = (
        dict(batch_sizes=(1, 8, 32), context_lens=(64, 512), decode_steps=8)
        if args.quick
        else dict(batch_sizes=(1, 4, 16, 32), context_lens=(64, 256, 512), decode_steps=16)
    )
    try:
        profile = calibrate(args.model, num_threads=args.threads or None, verbose=True, **grid)
        profile.save(args.out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_fit(profile), file=sys.stderr)
    print(f"profile written to {args.out}", file=sys.stderr)
    return 0


def _with_profile(args: argparse.Namespace, result, out):
    """Replace the roofline throughput with the profile's measured one (text or dict)."""
    if getattr(args, "profile", None) is None:
        return out
    from capacity.calibrate import Profile, predict_closed_loop
    from capacity.planner import replicas_for_peak, throughput_from_profile

    prof = Profile.load(args.profile)
    i = result.inputs
    conc = result.max_concurrency_avg if args.concurrency is None else args.concurrency
    if conc < 1:
        raise ValueError(f"plan: --concurrency={conc} must be >= 1")
    tok_s, req_s, step_s = throughput_from_profile(
        prof, conc, i.avg_input_tokens, i.avg_output_tokens
    )
    p99_step_s = predict_closed_loop(prof, conc, i.avg_input_tokens, i.avg_output_tokens)[
        "quantile_step_s"
    ]
    calibrated_max = max(prof.settings.get("batch_sizes", [conc]))
    eff = i.effective_utilization if i.effective_utilization is not None else i.utilization
    planned = req_s * eff * i.safety
    measured = {
        "profile": str(args.profile),
        "profile_device": prof.device,
        "concurrency": conc,
        "step_s": step_s,
        "p99_step_s": p99_step_s,
        "extrapolated": conc > calibrated_max,
        "raw_requests_per_s": req_s,
        "raw_tokens_per_s": tok_s,
        "replica_requests_per_s": planned,
        "replica_tokens_per_s": planned * i.avg_output_tokens,
        "replicas_at_peak": replicas_for_peak(i.peak_qps, planned) if planned > 0 else None,
    }
    if isinstance(out, dict):
        return {**out, "throughput_source": "profile", "profile_throughput": measured}
    lines = [
        out.split("\n\nThroughput (roofline")[0],
        "",
        f"Throughput (measured profile {args.profile}, {prof.device})",
        f"  step @ concurrency {conc}: {step_s * 1e3:.3f} ms (p99 {p99_step_s * 1e3:.3f} ms)",
        f"  raw: {req_s:.2f} req/s, {tok_s:.1f} output tok/s",
        f"  planned (x{eff:g} x safety {i.safety:g}): {planned:.2f} req/s",
        f"  replicas at peak {i.peak_qps:g} QPS: {measured['replicas_at_peak']}",
    ]
    if measured["extrapolated"]:
        lines.append(
            f"warning: concurrency {conc} is beyond the largest calibrated batch "
            f"({calibrated_max}); the profile is extrapolated (calibrate with bigger batches)"
        )
    lines += [ln for ln in out.splitlines() if ln.startswith("warning:")]
    return "\n".join(lines)
