"""Judging a frontier by day: per-day cost and violations, baselines at equal cost, 95% intervals.

A replay's judged week is seven days, not seven independent draws of one number, and one seed of
Poisson arrivals is one draw of the noise; so the targets are judged on per-day differences
(pooled over seeds per day) with a 95% t-interval over the days, beside the totals.

* `per_day`: GPU-hours, requests, violating requests and **violation-minutes** (seconds whose
  requests miss the TTFT SLO or are refused, / 60) of each judged day of one simulation.
* `at_gpu_hours`: a swept policy's per-day numbers at a given total cost, linear between the two
  sweep points around it (None outside the swept range: no extrapolation).
* `mean_ci95`: mean and 95% t-interval of a sample (t quantiles tabulated: no scipy).
Pure numpy.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

DAY_S = 86400
# two-sided 95% Student t quantiles by degrees of freedom (1..30); normal beyond
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def violating_seconds(
    ttft_s: np.ndarray, arrivals: np.ndarray, scored: np.ndarray, refused: np.ndarray, slo_s: float
) -> np.ndarray:
    """Per second: True when a scored request that second missed the SLO or was refused."""
    late = (ttft_s > slo_s) & (arrivals - refused > 0)
    return scored & (late | (refused > 0))


def per_day(
    replicas: np.ndarray,
    ttft_s: np.ndarray,
    arrivals: np.ndarray,
    scored: np.ndarray,
    refused: np.ndarray,
    slo_s: float,
) -> dict[str, list[float]]:
    """Each judged day's GPU-hours, requests, violating requests and violation-minutes (a last
    partial day counts as a day)."""
    bad_s = violating_seconds(ttft_s, arrivals, scored, refused, slo_s)
    served = np.where(scored, arrivals - refused, 0.0)
    violating = np.where(scored, refused, 0.0) + np.where(ttft_s > slo_s, served, 0.0)
    requests = np.where(scored, arrivals, 0.0)
    edges = np.arange(0, len(arrivals), DAY_S)

    def by_day(x: np.ndarray) -> list[float]:
        return np.add.reduceat(x.astype(float), edges).tolist()

    return {
        "gpu_hours": [g / 3600.0 for g in by_day(replicas)],
        "num_requests": by_day(requests),
        "num_slo_violations": by_day(violating),
        "violation_minutes": [v / 60.0 for v in by_day(bad_s)],
    }


def at_gpu_hours(rows: list[dict], gpu_hours: float, key: str) -> np.ndarray | None:
    """The per-day `key` of a swept policy at `gpu_hours` (its total), linear between the two
    sweep points around it; None when the sweep does not span it."""
    pts = sorted(rows, key=lambda r: r["gpu_hours"])
    for lo, hi in itertools.pairwise(pts):
        if lo["gpu_hours"] <= gpu_hours <= hi["gpu_hours"]:
            span = hi["gpu_hours"] - lo["gpu_hours"]
            w = 0.0 if span == 0 else (gpu_hours - lo["gpu_hours"]) / span
            a = np.asarray(lo["per_day"][key], dtype=float)
            b = np.asarray(hi["per_day"][key], dtype=float)
            return (1 - w) * a + w * b
    if len(pts) == 1 and pts[0]["gpu_hours"] == gpu_hours:
        return np.asarray(pts[0]["per_day"][key], dtype=float)
    return None


def t975(dof: int) -> float:
    if dof < 1:
        raise ValueError(f"dof={dof} is out of range; allowed: >= 1")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def mean_ci95(x: np.ndarray | list[float]) -> dict[str, float | int]:
    """Mean and 95% t-interval of a sample (its size n; the interval needs n >= 2)."""
    a = np.asarray(x, dtype=float)
    n = len(a)
    if n == 0:
        raise ValueError("mean_ci95 needs at least one value")
    mean = float(a.mean())
    if n == 1:
        return {"mean": mean, "lo": -math.inf, "hi": math.inf, "n": 1}
    half = t975(n - 1) * float(a.std(ddof=1)) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def day_differences(
    tideserve_rows: list[dict], baseline_rows: list[dict], key: str = "violation_minutes"
) -> np.ndarray | None:
    """Per day, the baseline's `key` at tideserve's GPU-hours minus tideserve's, averaged over
    seeds (one tideserve row and one baseline sweep per seed, in the same order). Where tideserve
    costs less than the baseline's cheapest point, that point stands in for it (a conservative
    comparison: spending less, the baseline would miss more); None when tideserve costs more than
    the baseline's costliest point in some seed (no extrapolation)."""
    diffs = []
    for ts, rows in zip(tideserve_rows, baseline_rows, strict=True):
        base = at_gpu_hours(rows, ts["gpu_hours"], key)
        cheapest = min(rows, key=lambda r: r["gpu_hours"])
        if base is None and ts["gpu_hours"] < cheapest["gpu_hours"]:
            base = np.asarray(cheapest["per_day"][key], dtype=float)
        if base is None:
            return None
        diffs.append(base - np.asarray(ts["per_day"][key], dtype=float))
    return np.mean(diffs, axis=0)
