"""Batch in the valleys: a compressed day of live interactive traffic, days without and with a
batch submitted at dawn (window = the day) alternating, on one hot replica of a tiny model.

    python benchmarks/batch_valleys.py [--quick] [--json PATH] [--day-s S] [--lines N] [--repeats R]

The peer is the same day without the batch, in the SAME run: days alternate without, with,
without, ... (R batch days, R + 1 days without), so the shared machine's drifting load hits both
kinds alike. Reports: interactive TTFT p99 with the batch / without it over all days of each
kind pooled (target <= 1.1), next to the baseline's own day-to-day spread (a ratio inside it is
noise to this run) and each batch day against the days either side; whether every batch
finished inside its window with every request answered once; the forecast-based completion
estimates the batch showed as it ran; and the hot replica's utilisation in the valleys and at
the peak without and with the batch (its running count, sampled at random times, mean 0.25 s).
Full run: a 240 s day, the issue's 500 requests, R = 2; --quick: a 60 s day, 150 requests, R = 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._batch_day import Day, run_day
from benchmarks._common import log, machine_info, start_local_ray, write_json
from common.stats import percentile

PORT, APP = 18950, "batch_valleys"
MAX_NUM_SEQS = 16
TTFT_TARGET = 1.1


def app_config(model_dir: Path, store: Path, capacity_rps: float, slot_share: float) -> dict:
    from tests.integration.serve_helpers import app_args

    return app_args(
        model_dir,
        pools={"cold": {"initial_replicas": 0}},
        engine={"max_num_seqs": MAX_NUM_SEQS},
        batch_api={"store_path": str(store), "poll_interval_s": 0.25, "slot_share": slot_share},
        controller={"enabled": False, "replica_capacity_rps": capacity_rps},
    )


def _p99(days: list[dict], phase: str) -> float:
    """p99 of every TTFT of these days pooled: more samples than any one day's p99."""
    return percentile([x for d in days for x in d["interactive"][phase]["ttft_samples_s"]], 99)


def _mean(values: list[float]) -> float:
    return sum(values) / max(len(values), 1)


def ttft_judgement(baselines: list[dict], batch_days: list[dict]) -> dict:
    """TTFT p99 with the batch / without it, judged against the baseline's own day-to-day spread.

    Days alternate (without, with, without, ...), so slow drift of the shared machine's load hits
    both sides alike. The ratio is of pooled p99s (all days' samples of a kind together); the
    baseline's spread is its largest day p99 over its smallest: a ratio inside that spread cannot
    be told apart from noise by this run."""
    base_days = [d["interactive"]["all"]["ttft_p99_s"] for d in baselines]
    with_days = [d["interactive"]["all"]["ttft_p99_s"] for d in batch_days]
    pooled = {
        kind: _p99(days, "all") for kind, days in (("without", baselines), ("with", batch_days))
    }
    ratio = round(pooled["with"] / pooled["without"], 3) if pooled["without"] else None
    spread = round(max(base_days) / min(base_days), 3) if min(base_days) > 0 else None
    # each batch day against the mean of the baseline days either side of it
    paired = [
        round(w / _mean(base_days[i : i + 2]), 3) if _mean(base_days[i : i + 2]) else None
        for i, w in enumerate(with_days)
    ]
    median_ratio = _ratio(median(with_days), median(base_days))
    met = ratio is not None and ratio <= TTFT_TARGET
    resolved = spread is not None and spread <= TTFT_TARGET
    verdict = _verdict(ratio, median_ratio, spread, met, resolved)
    return {
        "ttft_p99_ratio": ratio,
        "ttft_p99_target_ratio": TTFT_TARGET,
        "ttft_target_met": met,  # as measured; see ttft_resolved
        "ttft_resolved": resolved,  # the baseline days agree within the target ratio
        "ttft_verdict": verdict,
        "ttft_p99_pooled_without_s": pooled["without"],
        "ttft_p99_pooled_with_s": pooled["with"],
        "ttft_p99_by_day_without_s": base_days,
        "ttft_p99_by_day_with_s": with_days,
        "baseline_p99_spread": spread,
        "ttft_p99_ratio_paired": paired,
        # robust to one slow day on a shared machine: median day p99 with / without
        "ttft_p99_ratio_median_days": median_ratio,
        "ttft_p99_ratio_valley": _ratio(_p99(batch_days, "valley"), _p99(baselines, "valley")),
        "ttft_p99_ratio_peak": _ratio(_p99(batch_days, "peak"), _p99(baselines, "peak")),
    }


def _verdict(ratio, median_ratio, spread, met: bool, resolved: bool) -> str:
    measured = "met" if met else "not met"
    if resolved:
        return f"{measured}: pooled p99 ratio {ratio} (target {TTFT_TARGET}), spread {spread}x"
    return (
        f"not resolved by this run: the days without the batch differ by {spread}x (> "
        f"{TTFT_TARGET}); as measured {measured}: pooled p99 ratio {ratio}, median-day ratio "
        f"{median_ratio}"
    )


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def summary(baselines: list[dict], batch_days: list[dict]) -> dict:
    def util(days: list[dict], phase: str, key: str) -> float:
        return round(_mean([d["utilisation"][phase][key] for d in days]), 4)

    utilisation = {
        phase: {
            f"{key}_{side}": util(days, phase, key)
            for key in ("slot_utilisation", "busy_fraction")
            for side, days in (("without", baselines), ("with", batch_days))
        }
        for phase in ("valley", "peak")
    }
    batches = [d["batch"] for d in batch_days]
    valley = utilisation["valley"]
    return {
        **ttft_judgement(baselines, batch_days),
        "batch_inside_window": all(b["inside_window"] for b in batches),
        "batch_answered_once": all(
            b["num_answered_once"] == b["request_counts"]["total"] for b in batches
        ),
        "batch_completed_in_s": [b["completed_in_s"] for b in batches],
        "valley_utilisation_rises": valley["slot_utilisation_with"]
        > valley["slot_utilisation_without"],
        "utilisation": utilisation,
    }


def measure(day: Day, lines: int, capacity_rps: float, slot_share: float, repeats: int) -> dict:
    """Deploy, warm up, then alternate days: without, with, without, ... (`repeats` batch days,
    one more baseline day); shuts Serve down after."""
    from ray import serve

    from serving.tiny_models import save_tiny_model_dir
    from tests.integration.serve_helpers import deploy

    base = f"http://127.0.0.1:{PORT}"
    baselines, batch_days = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model_dir(Path(tmp) / "tiny", arch="qwen2", seed=7)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        try:
            args = app_config(model_dir, Path(tmp) / "store", capacity_rps, slot_share)
            deploy(args, APP, "/")
            warm = Day(day_s=5.0, valley_rps=2.0, peak_rps=2.0, seed=99)
            asyncio.run(run_day(base, APP, warm, MAX_NUM_SEQS, None))
            batch = {"lines": lines, "max_tokens": day.max_tokens}
            for r in range(repeats):
                log(f"repeat {r + 1}/{repeats}: day without the batch ({day.day_s:.0f} s)")
                baselines.append(asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, None)))
                log(f"repeat {r + 1}/{repeats}: day with a batch of {lines} requests")
                batch_days.append(asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, batch)))
            log("last day without the batch")
            baselines.append(asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, None)))
        finally:
            serve.shutdown()
    return {"baseline_days": baselines, "batch_days": batch_days}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 s day, 150 batch requests")
    parser.add_argument("--json", metavar="PATH", help="write the result JSON here")
    parser.add_argument("--day-s", type=float, default=None, help="length of the day (240)")
    parser.add_argument("--lines", type=int, default=None, help="batch requests (500)")
    parser.add_argument("--valley-rps", type=float, default=1.0)
    parser.add_argument("--peak-rps", type=float, default=6.0)
    parser.add_argument(
        "--capacity-rps",
        type=float,
        default=8.0,
        help="controller.replica_capacity_rps the lane plans live load against",
    )
    parser.add_argument("--slot-share", type=float, default=0.25, help="batch_api.slot_share")
    parser.add_argument(
        "--repeats", type=int, default=None, help="batch days, alternating with baseline (2; 1)"
    )
    parser.add_argument(
        "--resummarise",
        metavar="PATH",
        help="recompute the summary of a result file from its stored days (no run)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.resummarise:
        import json

        result = json.loads(Path(args.resummarise).read_text())
        result["summary"] = summary(result["baseline_days"], result["batch_days"])
        write_json(args.resummarise, result)
        print(json.dumps(result["summary"], indent=2))
        return 0
    day_s = args.day_s or (60.0 if args.quick else 240.0)
    lines = args.lines or (150 if args.quick else 500)
    repeats = args.repeats or (1 if args.quick else 2)
    day = Day(day_s=day_s, valley_rps=args.valley_rps, peak_rps=args.peak_rps)
    start_local_ray()
    t0 = time.monotonic()
    runs = measure(day, lines, args.capacity_rps, args.slot_share, repeats)
    result = {
        "benchmark": "batch_valleys",
        "quick": args.quick,
        "machine": machine_info("cpu", "float32"),
        "note": "shared 2-vCPU machine (other jobs running): numbers are noisy",
        "repeats": repeats,
        "day": {
            "day_s": day_s,
            "valley_rps": day.valley_rps,
            "peak_rps": day.peak_rps,
            "interactive_max_tokens": day.max_tokens,
            "num_interactive": len(day.arrivals()),
        },
        "batch_lines": lines,
        "lane": {"slot_share": args.slot_share, "replica_capacity_rps": args.capacity_rps},
        "summary": summary(runs["baseline_days"], runs["batch_days"]),
        **runs,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.json:
        write_json(args.json, result)
    import json

    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
