"""Calibration accuracy: does a calibrated profile predict the engine's throughput and p99 step?

    python benchmarks/capacity_accuracy.py [--quick] [--json PATH]

1. `capacity.calibrate.calibrate` on the tiny random Llama (hidden 256, 4 layers) on this device.
2. For each concurrency C, a FRESH engine runs a closed loop: C requests always in flight, each
   INPUT prompt tokens in and exactly OUTPUT tokens out (greedy, EOS ignored); when one finishes a
   new one is added. The first generation enters one by one, n_out / C steps apart, so finishes (and
   the replacement prefills) spread evenly over steps, the steady state the model assumes. After a
   warm-up of WARMUP x OUTPUT steps, a window of WINDOW x OUTPUT steps is measured: output tokens
   per wall second, and the p99 of the engine's own step_log step_s. This runs REPEATS times on
   fresh engines (3 in the full run): the median tokens/s and the p99 over all their steps count.
3. Both are compared with `predict_closed_loop` / `throughput_from_profile` from the profile.
torch runs on one thread in both phases to keep noise down.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_json
from capacity.calibrate import (
    calibrate,
    engine_config,
    format_fit,
    make_tiny_model_dir,
    predict_closed_loop,
)
from serving.engine import LLMEngine, SamplingParams

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def measure_closed_loop(
    model_dir: str, concurrency: int, n_in: int, n_out: int, warmup: int, window: int, seed: int
) -> dict[str, float]:
    engine = LLMEngine.from_pretrained(model_dir, engine_config(concurrency, n_in + n_out + 2))
    rng = np.random.default_rng(seed)

    def add(max_tokens: int) -> None:
        prompt = [int(t) for t in rng.integers(3, 500, size=n_in)]
        engine.add_request(
            prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        )

    # Ramp up: request k enters at step floor(k x n_out / C), so the C slots keep distinct phases
    # (one replacement prefill every n_out / C steps, never two in one step when C <= n_out).
    starts = [k * n_out // concurrency for k in range(concurrency)]
    warm_steps, win_steps = warmup * n_out + n_out, window * n_out
    tokens = 0
    t_start = 0.0
    log_start = 0
    for step in range(warm_steps + win_steps):
        for _ in range(starts.count(step)):
            add(n_out)
        if step == warm_steps:
            t_start, tokens, log_start = time.perf_counter(), 0, len(engine.step_log)
        touched = engine.step()
        tokens += sum(1 for s in touched if s.num_output_tokens > 0 and not s.error)
        for s in touched:
            if s.finished:
                add(n_out)
    wall = time.perf_counter() - t_start
    steps = [t.step_s for t in list(engine.step_log)[log_start:]]
    return dict(tokens_per_s=tokens / wall, step_s=steps)


def measure_repeated(
    model_dir: str, concurrency: int, n_in: int, n_out: int, warmup: int, window: int, repeats: int
) -> dict[str, float]:
    """The closed loop `repeats` times on fresh engines: median tokens/s, p99 over all steps.

    One window on this shared 2-vCPU machine swings by +-10% from run to run (other processes,
    frequency scaling); the median of several is what a profile can be held to.
    """
    runs = [
        measure_closed_loop(
            model_dir, concurrency, n_in, n_out, warmup, window, seed=concurrency + r
        )
        for r in range(repeats)
    ]
    steps = [s for run in runs for s in run["step_s"]]
    return dict(
        tokens_per_s=float(np.median([run["tokens_per_s"] for run in runs])),
        tokens_per_s_runs=[run["tokens_per_s"] for run in runs],
        p99_step_s=float(np.quantile(steps, 0.99)),
        mean_step_s=float(np.mean(steps)),
        steps=len(steps),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[4, 16, 32])
    ap.add_argument("--repeats", type=int, default=None, help="closed-loop runs per concurrency")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warmup, window = (1, 3) if args.quick else (2, 8)
    args.repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="tideserve-acc-") as tmp:
        model_dir = str(make_tiny_model_dir(tmp))
        log("calibrating")
        profile = calibrate(
            model_dir,
            decode_steps=8 if args.quick else 16,
            repeats=1 if args.quick else 2,
            verbose=True,
        )
        log("fit:\n" + format_fit(profile))
        points = []
        for c in args.concurrency:
            pred = predict_closed_loop(profile, c, args.input, args.output)
            meas = measure_repeated(
                model_dir, c, args.input, args.output, warmup, window, args.repeats
            )
            tok_err = pred["tokens_per_s"] / meas["tokens_per_s"] - 1
            p99_err = pred["quantile_step_s"] / meas["p99_step_s"] - 1
            points.append(
                dict(
                    concurrency=c,
                    predicted_tokens_per_s=pred["tokens_per_s"],
                    measured_tokens_per_s=meas["tokens_per_s"],
                    measured_tokens_per_s_runs=meas["tokens_per_s_runs"],
                    tokens_per_s_error=tok_err,
                    predicted_p99_step_s=pred["quantile_step_s"],
                    measured_p99_step_s=meas["p99_step_s"],
                    p99_step_error=p99_err,
                    predicted_mean_step_s=pred["mean_step_s"],
                    measured_mean_step_s=meas["mean_step_s"],
                    measured_steps=meas["steps"],
                )
            )
            log(
                f"C={c:3d} tokens/s pred {pred['tokens_per_s']:8.1f} meas "
                f"{meas['tokens_per_s']:8.1f} ({tok_err:+.1%})  p99 step pred "
                f"{pred['quantile_step_s'] * 1e3:6.2f} ms meas {meas['p99_step_s'] * 1e3:6.2f} ms "
                f"({p99_err:+.1%})"
            )
    max_err = float(
        max(max(abs(p["tokens_per_s_error"]), abs(p["p99_step_error"])) for p in points)
    )
    result = dict(
        benchmark="capacity_accuracy",
        quick=args.quick,
        workload=dict(
            input_tokens=args.input,
            output_tokens=args.output,
            warmup=warmup,
            window=window,
            repeats=args.repeats,
        ),
        profile=profile.to_dict(with_points=False),
        points=points,
        max_abs_error=max_err,
        target_within_10pct=bool(max_err <= 0.10),
        elapsed_s=time.perf_counter() - _T0,
    )
    if args.json:
        write_json(args.json, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
