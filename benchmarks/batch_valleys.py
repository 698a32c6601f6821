"""Batch in the valleys: a compressed day of live interactive traffic, run without and then with
a batch submitted at dawn (window = the day), on one hot replica of a tiny model.

    python benchmarks/batch_valleys.py [--quick] [--json PATH] [--day-s S] [--lines N]

Reports, from the SAME run: interactive TTFT p99 with the batch / without it (target <= 1.1; the
peer is the mean of a day without the batch run before and one run after it),
whether the batch finished inside its window with every request answered once, and the hot
replica's utilisation in the valleys and at the peak before and after (sampled every 0.25 s
from the replica's own running count). The peer is the same day without the batch.
Full run: a 240 s day and the issue's 500 requests; --quick: a 60 s day and 150 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before anything imports ray
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._batch_day import Day, run_day
from benchmarks._common import log, machine_info, start_local_ray, write_json

PORT, APP = 18950, "batch_valleys"
MAX_NUM_SEQS = 16


def app_config(model_dir: Path, store: Path, capacity_rps: float, slot_share: float) -> dict:
    from tests.integration.serve_helpers import app_args

    return app_args(
        model_dir,
        pools={"cold": {"initial_replicas": 0}},
        engine={"max_num_seqs": MAX_NUM_SEQS},
        batch={"store_path": str(store), "poll_interval_s": 0.25, "slot_share": slot_share},
        controller={"enabled": False, "replica_capacity_rps": capacity_rps},
    )


def summary(without: dict, with_batch: dict) -> dict:
    def ratio(key: str, phase: str) -> float | None:
        a = without["interactive"][phase][key]
        b = with_batch["interactive"][phase][key]
        return round(b / a, 3) if a else None

    util = {
        phase: {
            "slot_utilisation_without": without["utilisation"][phase]["slot_utilisation"],
            "slot_utilisation_with": with_batch["utilisation"][phase]["slot_utilisation"],
            "busy_fraction_without": without["utilisation"][phase]["busy_fraction"],
            "busy_fraction_with": with_batch["utilisation"][phase]["busy_fraction"],
        }
        for phase in ("valley", "peak")
    }
    batch = with_batch["batch"]
    return {
        "ttft_p99_ratio": ratio("ttft_p99_s", "all"),
        "ttft_p99_ratio_valley": ratio("ttft_p99_s", "valley"),
        "ttft_p99_ratio_peak": ratio("ttft_p99_s", "peak"),
        "ttft_p99_target_ratio": 1.1,
        "ttft_target_met": (ratio("ttft_p99_s", "all") or 99) <= 1.1,
        "batch_inside_window": batch["inside_window"],
        "batch_answered_once": batch["num_answered_once"] == batch["request_counts"]["total"],
        "valley_utilisation_rises": util["valley"]["slot_utilisation_with"]
        > util["valley"]["slot_utilisation_without"],
        "utilisation": util,
    }


def measure(day: Day, lines: int, capacity_rps: float, slot_share: float) -> dict:
    """Deploy, warm up, run the day without and with the batch; shuts Serve down after."""
    from ray import serve

    from serving.tiny_models import save_tiny_model_dir
    from tests.integration.serve_helpers import deploy

    base = f"http://127.0.0.1:{PORT}"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model_dir(Path(tmp) / "tiny", arch="qwen2", seed=7)
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        try:
            args = app_config(model_dir, Path(tmp) / "store", capacity_rps, slot_share)
            deploy(args, APP, "/")
            warm = Day(day_s=5.0, valley_rps=2.0, peak_rps=2.0, seed=99)
            asyncio.run(run_day(base, APP, warm, MAX_NUM_SEQS, None))
            # without, with, without again: the machine's load drifts (other jobs share it), so
            # the peer is the mean of the days either side of the batch day
            log(f"day without the batch ({day.day_s:.0f} s)")
            before = asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, None))
            log(f"day with a batch of {lines} requests")
            batch = {"lines": lines, "max_tokens": day.max_tokens}
            with_batch = asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, batch))
            log("day without the batch, again")
            after = asyncio.run(run_day(base, APP, day, MAX_NUM_SEQS, None))
        finally:
            serve.shutdown()
    return {
        "without_batch": mean_day(before, after),
        "with_batch": with_batch,
        "without_batch_before": before,
        "without_batch_after": after,
    }


def mean_day(a: dict, b: dict) -> dict:
    """The element-wise mean of two reports of the same shape (numbers only)."""
    if isinstance(a, dict):
        return {k: mean_day(a[k], b[k]) for k in a}
    return (a + b) / 2 if isinstance(a, int | float) and isinstance(b, int | float) else a


def main(argv: list[str] | None = None) -> int:
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
    parser.add_argument("--slot-share", type=float, default=0.25, help="batch.slot_share")
    args = parser.parse_args(argv)
    day_s = args.day_s or (60.0 if args.quick else 240.0)
    lines = args.lines or (150 if args.quick else 500)
    day = Day(day_s=day_s, valley_rps=args.valley_rps, peak_rps=args.peak_rps)
    start_local_ray()
    t0 = time.monotonic()
    runs = measure(day, lines, args.capacity_rps, args.slot_share)
    result = {
        "benchmark": "batch_valleys",
        "quick": args.quick,
        "machine": machine_info("cpu", "float32"),
        "note": "shared 2-vCPU machine (other jobs running): numbers are noisy",
        "day": {
            "day_s": day_s,
            "valley_rps": day.valley_rps,
            "peak_rps": day.peak_rps,
            "interactive_max_tokens": day.max_tokens,
            "num_interactive": len(day.arrivals()),
        },
        "batch_lines": lines,
        "lane": {"slot_share": args.slot_share, "replica_capacity_rps": args.capacity_rps},
        "summary": summary(runs["without_batch"], runs["with_batch"]),
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
