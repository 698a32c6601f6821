"""Choosing the autoscaling policy's settings on validation data only (the protocol's tuning run).

    python benchmarks/autoscaling_validation.py [--quick] [--json PATH] [--jobs N] [--seeds N]
                                                [--candidates NAME ...]

Every split comes from `autoscaling/replay/protocol.validation_splits` and passes its gate
(`for_tuning`): the synthetic shapes' rolling origins (train 1-7 judge 8-10, train 1-10 judge
11-14) and the shared traces' training week (train 1-5, judge 6-7). The shared traces' days 8-14,
the test set, cannot be replayed here. Arrivals are interpolated (autoscaling/replay/arrivals.py);
seed k draws its own Poisson arrivals and moves the curve k x 137 s later.

Per candidate setting and split: tideserve's SLO attainment and GPU-hours over the oracle's,
T1 (>= 99.5% at <= 1.15x), and reactive and Knative at utilisation 0.85 beside it. A candidate
is judged by the share of (split, seed) replays meeting T1, then by its mean cost.
--quick: two shapes, one seed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaling.headroom import HeadroomConfig
from autoscaling.policy import PolicyConfig
from autoscaling.replay.protocol import Split, validation_splits
from autoscaling.replay.runner import ReplaySettings, run_replay
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.traces import RateTrace, load_trace
from benchmarks._common import TRACES_DIR, log, machine_info, write_json
from benchmarks.autoscaling_shapes import shapes

PHASE_STEP_S = 137
POLICIES = ("tideserve", "reactive", "knative", "oracle")
# name -> (HeadroomConfig overrides, PolicyConfig overrides, hot quantile or None: the default)
CANDIDATES: dict[str, tuple[dict, dict, float | None]] = {
    "defaults": ({}, {}, None),
    "no_trend": ({}, {"trend_window_s": 0.0}, None),
    "hot_quantile_0.01": ({}, {}, 0.01),
    "hot_quantile_0": ({}, {}, 0.0),
    "feedback_gain_3e-4": ({"feedback_gain_per_s": 3e-4}, {}, None),
    "stabilization_300s": ({}, {"stabilization_window_s": 300.0}, None),
    "volatility_classes_1": ({"num_volatility_classes": 1}, {}, None),
    "trend_300s": ({}, {"trend_window_s": 300.0}, None),
    "trend_600s": ({}, {"trend_window_s": 600.0}, None),
    "trend_180s": ({}, {"trend_window_s": 180.0}, None),
    "trend_120s": ({}, {"trend_window_s": 120.0}, None),
    "trend_60s": ({}, {"trend_window_s": 60.0}, None),
    "trend_180s_quantile_0.99": ({"quantile": 0.99}, {"trend_window_s": 180.0}, None),
    "trend_180s_quantile_0.98": ({"quantile": 0.98}, {"trend_window_s": 180.0}, None),
    "trend_300s_stabilization_60s": (
        {},
        {"trend_window_s": 300.0, "stabilization_window_s": 60.0},
        None,
    ),
    "trend_300s_horizon_0": ({}, {"trend_window_s": 300.0, "horizon_s": 0.0}, None),
    # a second point on each frontier: the same policy at a lower headroom quantile
    "quantile_0.99": ({"quantile": 0.99}, {}, None),
    "trend_300s_quantile_0.99": ({"quantile": 0.99}, {"trend_window_s": 300.0}, None),
}


def _trace(source: str) -> RateTrace:
    if source in shapes():
        return RateTrace(source, "rate_series", 600.0, 0.0, shapes()[source])
    return load_trace(TRACES_DIR / f"servegen_language_{source}_total.csv")


def run_one(task: tuple[str, Split, int]) -> dict:
    name, split, seed = task
    head_kw, pol_kw, hot_q = CANDIDATES[name]
    cfg = PolicyConfig(replica_capacity_rps=20.0, ttft_slo_s=1.0, **pol_kw)
    base = ReplaySettings(
        policies=POLICIES,
        scale_to_peak_replicas=20,
        cold_start_s=120.0,
        headroom=replace(HeadroomConfig(), **head_kw),
        seed=seed,
        arrival_shape="interpolated",
        phase_s=(seed * PHASE_STEP_S) % 600,
    )
    if hot_q is not None:
        base = replace(base, hot_quantile=hot_q)
    report, _, _ = run_replay(_trace(split.source), cfg, ServiceModel(20.0), split.settings(base))
    rows = {r["name"]: r for r in report["policies"]}
    oracle = rows["oracle"]["gpu_hours"]
    out = {
        p: {
            "slo_attainment": r["slo_attainment"],
            "gpu_hours_over_oracle": r["gpu_hours"] / oracle,
            "violation_minutes": r["violation_minutes"],
        }
        for p, r in rows.items()
    }
    ts = out["tideserve"]
    ts["t1"] = ts["slo_attainment"] >= 0.995 and ts["gpu_hours_over_oracle"] <= 1.15
    return {"candidate": name, "split": split.label, "seed": seed, "policies": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two shapes, one seed")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--jobs", type=int, default=1, help="replays in parallel (processes)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    ap.add_argument(
        "--shared-only", action="store_true", help="only the shared traces' training-week splits"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = list(shapes())[:2] if args.quick else list(shapes())
    names = [] if args.shared_only else names
    splits = validation_splits(names, () if args.quick else ("m-small", "m-large"))
    seeds = 1 if args.quick else args.seeds
    tasks = [(c, sp, k) for c in args.candidates for sp in splits for k in range(seeds)]
    rows = []
    pool = multiprocessing.get_context("fork").Pool(args.jobs) if args.jobs > 1 else None
    try:
        for done, res in enumerate((pool.imap if pool else map)(run_one, tasks), 1):
            rows.append(res)
            ts = res["policies"]["tideserve"]
            slo, cost = 100 * ts["slo_attainment"], ts["gpu_hours_over_oracle"]
            log(f"{done}/{len(tasks)} {res['candidate']} {res['split']} seed {res['seed']}: "
                f"{slo:.2f}% at {cost:.3f}x")  # fmt: skip
    finally:
        if pool:
            pool.close()
            pool.join()
    summary = {}
    for c in args.candidates:
        mine = [r["policies"]["tideserve"] for r in rows if r["candidate"] == c]
        summary[c] = {
            "t1_share": float(np.mean([m["t1"] for m in mine])),
            "mean_slo_attainment": float(np.mean([m["slo_attainment"] for m in mine])),
            "mean_gpu_hours_over_oracle": float(
                np.mean([m["gpu_hours_over_oracle"] for m in mine])
            ),
        }
        print(c, summary[c])
    out = {"benchmark": "autoscaling_validation", "quick": args.quick, "seeds": seeds}
    out["shared_only"] = args.shared_only
    out["splits"] = [sp.label for sp in splits]
    out["candidates"] = {c: [repr(x) for x in CANDIDATES[c]] for c in args.candidates}
    out["summary"], out["rows"] = summary, rows
    out["wall_s"] = time.perf_counter() - t0
    out["machine_info"] = machine_info("cpu", "float64 (numpy replay)")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
