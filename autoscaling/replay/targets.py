"""The autoscaling targets T1-T3 (docs/autoscaling.md), judged per seed and across seeds.

    T1   tideserve at its defaults: >= 99.5% of requests within the TTFT SLO at <= 1.15x the
         oracle's GPU-hours (every seed)
    T2   the fewest GPU-hours to reach 99.5% among tideserve and every baseline (every seed)
    T3a  at tideserve's GPU-hours, fewer violation-minutes than every baseline interpolated to
         the same GPU-hours, with the 95% interval of the per-day difference above 0 (days
         pooled over seeds: autoscaling/replay/judge.py)
    T3b  at 99.5%, >= 10% fewer GPU-hours than the best baseline reaching it (every seed)

Baselines are reactive, Knative and the 70/30 rule; the oracle and the present-rate and
next-window references have hindsight, so they are yardsticks reported beside, never beaten for
a target. `gpu_hours_to_reach` comes from autoscaling/replay/frontier.py. Pure.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from autoscaling.replay import judge

BASELINES = ("reactive", "knative", "rule_70_30")
REFERENCES = ("oracle", "present_rate", "next_window", "rate_oracle")
SLO = 0.995
T1_MAX_OVER_ORACLE = 1.15
T3B_MIN_SAVING = 0.10
MIX_STEPS = 101  # t3a_ceiling's grid between two swept points of a baseline


def default_row(sweeps: dict[str, list[dict]], default_q: float) -> dict:
    return next(r for r in sweeps["tideserve"] if r["value"] == default_q)


def _best_baseline_reach(reach: dict[str, float | None]) -> float | None:
    """The fewest GPU-hours to 99.5% among the baselines in `reach` that get there (None: none
    does, or none was swept)."""
    return min((reach[p] for p in BASELINES if reach.get(p) is not None), default=None)


def _rows_by_point(per_seed: list[dict[str, list[dict]]], policy: str) -> list[list[dict]]:
    """Each swept point of `policy` as its row at every seed (the points every seed swept)."""
    num_points = min(len(sw[policy]) for sw in per_seed)
    return [[sw[policy][i] for sw in per_seed] for i in range(num_points)]


def seed_targets(
    sweeps: dict[str, list[dict]],
    default_q: float,
    gpu_hours_to_reach: Callable[[list[dict], float], float | None],
) -> dict:
    """T1, T2, T3b and the violation-minutes of one seed's sweeps."""
    oracle = sweeps["oracle"][0]["gpu_hours"]
    ts = default_row(sweeps, default_q)
    reach = {p: gpu_hours_to_reach(rows, SLO) for p, rows in sweeps.items()}
    best = _best_baseline_reach(reach)
    ts_reach = reach["tideserve"]
    minutes = {}
    for p in (*BASELINES, *REFERENCES[1:]):
        if p in sweeps:
            at = judge.at_gpu_hours(sweeps[p], ts["gpu_hours"], "violation_minutes")
            minutes[p] = None if at is None else float(at.sum())
    return {
        "tideserve_slo_attainment": ts["slo_attainment"],
        "tideserve_gpu_hours_over_oracle": ts["gpu_hours"] / oracle,
        "tideserve_violation_minutes": ts["violation_minutes"],
        "violation_minutes_at_tideserve_gpu_hours": minutes,
        "gpu_hours_to_99_5_over_oracle": {
            p: None if g is None else g / oracle for p, g in reach.items()
        },
        "t1": ts["slo_attainment"] >= SLO and ts["gpu_hours"] <= T1_MAX_OVER_ORACLE * oracle,
        "t2": ts_reach is not None and (best is None or ts_reach < best),
        "t3b_saving_over_best_baseline": None
        if ts_reach is None or best is None
        else 1.0 - ts_reach / best,
        "t3b": ts_reach is not None and (best is None or ts_reach <= (1 - T3B_MIN_SAVING) * best),
    }


def _t3a_against(rows: list[dict], per_seed: list[dict[str, list[dict]]], others) -> dict:
    """T3a for one policy point per seed (`rows`) against each of `others`' sweeps: the per-day
    violation-minute differences at its GPU-hours, their mean and 95% interval."""
    t3a = {}
    for p in others:
        if not all(p in sw for sw in per_seed):
            continue
        diffs = judge.day_differences(rows, [sw[p] for sw in per_seed])
        if diffs is None:
            t3a[p] = {"spans_tideserve_gpu_hours": False}
            continue
        ci = judge.mean_ci95(diffs)
        t3a[p] = {
            "spans_tideserve_gpu_hours": True,
            "per_day_minutes_fewer_than_it": diffs.tolist(),
            "mean_ci95": ci,
            "interval_above_zero": ci["lo"] > 0,
        }
    return t3a


def _meets_t3a(t3a: dict) -> bool:
    base = [t3a[p] for p in BASELINES if p in t3a]  # a baseline not swept is not judged
    return all(b.get("interval_above_zero", False) for b in base)


def across_seeds(per_seed: list[dict[str, list[dict]]], default_q: float, per_seed_targets):
    """Every target over all seeds; T3a on the per-day violation-minute differences."""
    ts_rows = [default_row(sw, default_q) for sw in per_seed]
    t3a = _t3a_against(ts_rows, per_seed, (*BASELINES, *REFERENCES[1:]))
    slo = [t["tideserve_slo_attainment"] for t in per_seed_targets]
    cost = [t["tideserve_gpu_hours_over_oracle"] for t in per_seed_targets]
    return {
        "num_seeds": len(per_seed),
        "tideserve_slo_attainment": judge.mean_ci95(slo),
        "tideserve_gpu_hours_over_oracle": judge.mean_ci95(cost),
        "tideserve_violation_minutes_mean": float(
            np.mean([t["tideserve_violation_minutes"] for t in per_seed_targets])
        ),
        "t3a_per_day_difference": t3a,
        "targets": {
            "t1_every_seed": all(t["t1"] for t in per_seed_targets),
            "t2_every_seed": all(t["t2"] for t in per_seed_targets),
            "t3a_every_baseline": _meets_t3a(t3a),
            "t3b_every_seed": all(t["t3b"] for t in per_seed_targets),
        },
    }


def _over_oracle(rows: list[dict], per_seed: list[dict[str, list[dict]]]) -> float:
    """The mean over seeds of a point's GPU-hours as a multiple of the oracle's."""
    oracle = [sw["oracle"][0]["gpu_hours"] for sw in per_seed]
    return float(np.mean([r["gpu_hours"] / g for r, g in zip(rows, oracle, strict=True)]))


def _best_lower_bound_between(points: list[dict]) -> float:
    """The highest lower bound of the 95% interval over mixes of neighbouring points' per-day
    minutes (-inf with fewer than two points)."""
    pts = sorted(points, key=lambda p: p["gpu_hours_over_oracle_mean"])
    best = -math.inf
    for lo, hi in itertools.pairwise(pts):
        a = np.asarray(lo["per_day_violation_minutes"])
        b = np.asarray(hi["per_day_violation_minutes"])
        for w in np.linspace(0.0, 1.0, MIX_STEPS):
            best = max(best, judge.mean_ci95((1 - w) * a + w * b)["lo"])
    return float(best)


def t3a_ceiling(per_seed: list[dict[str, list[dict]]]) -> dict:
    """The most T3a any policy could score. At a baseline's swept point, a policy with no
    violation at all has, day by day, the baseline's own violation-minutes as its difference
    (and, by the stand-in rule of judge.day_differences, at any lower cost the cheapest point's);
    between two points the baseline is interpolated, a mix of the two, checked here on a grid of
    MIX_STEPS mixes (seeds averaged per day); past the costliest there is no comparison. So where
    neither a point nor a mix has the interval of the baseline's own per-day violation-minutes
    above 0 (a day it misses nothing pins the difference at 0), no policy at any cost meets T3a
    against it. `possible` needs that for every baseline: necessary, not sufficient (T3a compares
    them at one cost)."""
    by_baseline = {}
    for b in BASELINES:
        if not all(b in sw for sw in per_seed):
            continue
        points = []
        for rows in _rows_by_point(per_seed, b):
            own = np.mean([r["per_day"]["violation_minutes"] for r in rows], axis=0)
            ci = judge.mean_ci95(own)
            points.append(
                {
                    "value": rows[0]["value"],
                    "gpu_hours_over_oracle_mean": _over_oracle(rows, per_seed),
                    "per_day_violation_minutes": own.tolist(),
                    "mean_ci95": ci,
                    "interval_above_zero": ci["lo"] > 0,
                }
            )
        best_lo = _best_lower_bound_between(points)
        above = any(p["interval_above_zero"] for p in points) or best_lo > 0
        by_baseline[b] = {
            "points": points,
            "highest_lower_bound_between_points": best_lo,
            "above_zero_at_some_cost": above,
        }
    return {
        "by_baseline": by_baseline,
        "possible": bool(by_baseline)
        and all(v["above_zero_at_some_cost"] for v in by_baseline.values()),
    }


def references_judged_as_policies(
    per_seed: list[dict[str, list[dict]]],
    gpu_hours_to_reach: Callable[[list[dict], float], float | None],
) -> dict:
    """T3 as if each hindsight reference were the policy: how far knowing the present, the
    next window's mean or the whole rate curve gets against the same baselines. Per swept point,
    T3a (the per-day difference against every baseline at that point's GPU-hours); per
    reference, T3b's saving at 99.5% over the best baseline reaching it, seed by seed. A target
    no reference meets is out of reach of any forecast of what that reference is told."""
    out = {}
    for ref in REFERENCES[1:]:
        if not all(ref in sw for sw in per_seed):
            continue
        points = []
        for rows in _rows_by_point(per_seed, ref):
            t3a = _t3a_against(rows, per_seed, BASELINES)
            points.append(
                {
                    "value": rows[0]["value"],
                    "gpu_hours_over_oracle_mean": _over_oracle(rows, per_seed),
                    "t3a": {p: t.get("mean_ci95") for p, t in t3a.items()},
                    "meets_t3a": _meets_t3a(t3a),
                }
            )
        savings = []
        for sw in per_seed:
            reach = gpu_hours_to_reach(sw[ref], SLO)
            best = _best_baseline_reach(
                {p: gpu_hours_to_reach(sw[p], SLO) for p in BASELINES if p in sw}
            )
            savings.append(None if reach is None or best is None else 1.0 - reach / best)
        out[ref] = {
            "points": points,
            "meets_t3a_at_some_point": any(p["meets_t3a"] for p in points),
            "t3b_saving_by_seed": savings,
            "meets_t3b_every_seed": all(s is not None and s >= T3B_MIN_SAVING for s in savings),
        }
    return out
