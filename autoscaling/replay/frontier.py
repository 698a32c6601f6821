"""The cost/SLO frontier: sweep each policy's one knob over one prepared trace, then compare.

Each policy has a single knob that trades GPU-hours for SLO attainment:

    reactive     target_ongoing_requests (Ray Serve's default policy; Ray's own default is 2)
    knative      target concurrency per replica (KPA)
    rule_70_30   the hot pool's fraction of the training peak (R6 says 0.7); the rest reactive
    tideserve    the headroom quantile of the forecast's own errors (autoscaling/headroom.py)
    present_rate a reference, not a baseline: decide() told each window's true rate, with a fixed
                 headroom multiple (autoscaling/replay/reference.py); hindsight of the present
    next_window  the same, also told the next window's mean one tick plus one cold start before
                 its edge: the upper yardstick, which no window edge surprises
    oracle       no knob: knows the future, holds exactly what each second needs
    rate_oracle  a reference: knows the rate curve ahead (not the arrivals), holds what its
                 highest rate over a cold start needs plus the queue margin of the swept tail

Concurrency targets are in requests in flight per replica; one replica at capacity holds
replica_capacity_rps x mean_e2e_s of them (Little's law), which is how they map onto the replay's
utilisation. `gpu_hours_to_reach` and `violations_at` read the frontier (pure, numpy-free).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from autoscaling.forecast import Forecaster
from autoscaling.policy import PolicyConfig
from autoscaling.replay import episodes, judge
from autoscaling.replay.baselines import (
    KnativeController,
    OracleController,
    RateOracleController,
    ReactiveController,
    replicas_for,
)
from autoscaling.replay.reference import PresentRateController
from autoscaling.replay.runner import Prepared, ReplaySettings, metrics
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.sim import simulate
from autoscaling.replay.tideserve import TideserveController, learn_hot_replicas

RAY_DEFAULT_TARGET_ONGOING = 2.0  # ray.serve.config.AutoscalingConfig.target_ongoing_requests


@dataclass(frozen=True)
class Sweep:
    policy: str
    knob: str
    values: tuple[float, ...]
    labels: dict[float, str] | None = None  # honest names for special points (Ray's default)


SWEEP_LEVELS = ("quick", "seeds", "full")


def default_sweeps(service: ServiceModel, level: str) -> tuple[Sweep, ...]:
    """Knob values spanning cheap-and-late to safe-and-costly for every policy. `level`:
    "quick" (a smoke run), "seeds" (the few points around the targets' costs that a sweep per
    seed can afford: no Ray default, whose 5x cost is far off every target) or "full"."""
    if level not in SWEEP_LEVELS:
        raise ValueError(f"sweep level={level!r} is not known; choose from {SWEEP_LEVELS}")
    quick, seeds = level == "quick", level == "seeds"
    full = service.replica_capacity_rps * service.mean_e2e_s  # in flight at capacity
    utils = (0.6, 0.75, 0.85, 0.95) if quick else (0.6, 0.7, 0.75, 0.8, 0.85, 0.95)
    # seeds: reactive reaches past tideserve's default cost at 0.7 and falls below 99.5% at
    # 0.9; Knative crosses 99.5% between 0.85 and 0.9 on both shared traces, so its points sit
    # there, as tideserve's do around its crossing (q 0.99-0.995): a crossing read between two
    # far-apart points of a kinked frontier overstates its cost
    utils = (0.7, 0.8, 0.9) if seeds else utils
    targets = tuple(round(u * full, 1) for u in utils)
    kn_utils = (0.8, 0.85, 0.875, 0.9) if seeds else utils
    kn_targets = tuple(round(u * full, 1) for u in kn_utils)
    fractions = (0.5, 0.7, 0.9) if quick else (0.5, 0.7, 0.8, 0.9, 1.0)
    # seeds: the rule's points span tideserve's cost (0.2-0.5), so T3a compares it at equal
    # GPU-hours, and R6's 0.7
    fractions = (0.2, 0.35, 0.5, 0.7) if seeds else fractions
    quantiles = (0.9, 0.99, 0.995) if quick else (0.95, 0.98, 0.99, 0.995, 0.998, 0.999)
    quantiles = (0.98, 0.99, 0.993, 0.995) if seeds else quantiles
    multiples = (1.2, 1.4, 1.6) if quick else (1.2, 1.3, 1.4, 1.5, 1.6, 1.8)
    multiples = (1.2,) if seeds else multiples
    ahead = (1.1, 1.2, 1.4) if quick else (1.05, 1.1, 1.2, 1.3, 1.4)
    ahead = (1.1, 1.2) if seeds else ahead
    # the rate oracle's queue-tail share: 0.5 plans almost at the rate, 5e-4 ~4x the margin of 0.05
    tails = (0.5, 0.05, 0.005) if quick else (0.5, 0.2, 0.05, 0.01, 0.001)
    tails = (0.5, 0.05, 0.005, 0.0005) if seeds else tails
    reactive = targets if seeds else (RAY_DEFAULT_TARGET_ONGOING, *targets)
    return (
        Sweep(
            "reactive",
            "target_ongoing_requests",
            reactive,
            {RAY_DEFAULT_TARGET_ONGOING: "Ray default (target_ongoing_requests=2)"},
        ),
        Sweep("knative", "target_concurrency", kn_targets),
        Sweep("rule_70_30", "hot_fraction_of_training_peak", fractions, {0.7: "R6's 70/30"}),
        Sweep("tideserve", "headroom_quantile", quantiles),
        Sweep("present_rate", "fixed_headroom", multiples),
        Sweep("next_window", "fixed_headroom", ahead),
        Sweep("oracle", "none", (0.0,)),
        Sweep("rate_oracle", "queue_tail_share", tails),
    )


def _pools(prep: Prepared, cfg: PolicyConfig, s: ReplaySettings, max_n: int) -> PolicyConfig:
    """tideserve's pools in the replay: the hot pool learned from the training days, the cold
    pool up to the elastic policies' common maximum."""
    hot = learn_hot_replicas(prep.train_rates, cfg, s.hot_quantile)
    return replace(cfg, hot_replicas=hot, max_cold_replicas=max(max_n - hot, 0))


def _controller(policy: str, value: float, prep: Prepared, cfg: PolicyConfig, svc, s):
    cap, e2e = svc.replica_capacity_rps, svc.mean_e2e_s
    peak_n = replicas_for(prep.peak_rps, cap, cfg.target_utilization)
    max_n = max(math.ceil(peak_n * s.max_replicas_factor), 1)
    if policy == "reactive":
        return ReactiveController(policy, cap, value / (cap * e2e), e2e, 1, max_n)
    if policy == "knative":
        return KnativeController(policy, cap, value / (cap * e2e), e2e, max_replicas=max_n)
    if policy == "rule_70_30":
        train_peak = float(np.nanmax(prep.train_rates)) if len(prep.train_rates) else prep.peak_rps
        hot = max(math.ceil(value * replicas_for(train_peak, cap, cfg.target_utilization)), 1)
        u = cfg.target_utilization
        return ReactiveController(policy, cap, u, e2e, hot_replicas=hot, max_replicas=max_n)
    if policy == "present_rate":
        tcfg = _pools(prep, cfg, s, max_n)
        return PresentRateController(
            tcfg, prep.arrivals, prep.t0_s, prep.bin_s, value, s.interval_s, s.starts.p95_s
        )
    if policy == "next_window":
        tcfg = _pools(prep, cfg, s, max_n)
        return PresentRateController(
            tcfg, prep.arrivals, prep.t0_s, prep.bin_s, value, s.interval_s, s.starts.p95_s,
            name=policy, ahead_s=s.starts.p95_s + s.interval_s,
        )  # fmt: skip
    if policy == "tideserve":
        head = replace(s.headroom, quantile=value)
        tcfg = _pools(prep, cfg, s, max_n)
        ctl = TideserveController(
            tcfg, Forecaster(s.forecast), cold_start_p95_s=s.starts.p95_s, headroom=head
        )
        if len(prep.train_rates):
            ctl.train(prep.t0_s - len(prep.train_rates) * prep.bin_s, prep.bin_s, prep.train_rates)
        return ctl
    if policy == "oracle":
        return OracleController(policy, prep.arrivals, prep.t0_s, cap, s.oracle_look_s)
    if policy == "rate_oracle":
        tail = replace(cfg, queue_tail_share=value)
        return RateOracleController(policy, prep.rate_s, prep.t0_s, cap, s.oracle_look_s, tail)
    raise ValueError(f"policy={policy!r} has no frontier sweep")


_SHARED: tuple = ()  # (prep, cfg, svc, settings) for worker processes, inherited by fork


def _one(task: tuple[Sweep, float]) -> dict:
    sw, value = task
    prep, cfg, svc, s = _SHARED
    t = time.perf_counter()
    ctl = _controller(sw.policy, value, prep, cfg, svc, s)
    res = simulate(
        ctl, prep.arrivals, prep.observed, prep.t0_s, svc, s.interval_s, s.cold_start_s,
        draw_cold_starts=s.starts.sampler(s.seed),
    )  # fmt: skip
    row = metrics(res, prep, cfg.ttft_slo_s)
    row.pop("last_reasons")
    floor_s = s.interval_s + s.cold_start_s  # the fastest answer to a step no one foresaw
    # (with measured starts cold_start_s is their median: the typical answer's length)
    row["episodes"] = episodes.summarise(
        res.ttft_s, prep.arrivals, prep.scored, cfg.ttft_slo_s, prep.bin_s, floor_s,
        refused=res.refused,
    )  # fmt: skip
    row["per_day"] = judge.per_day(
        res.replicas, res.ttft_s, prep.arrivals, prep.scored, res.refused, cfg.ttft_slo_s
    )
    row.update(policy=sw.policy, knob=sw.knob, value=value, hot_replicas=ctl.hot_replicas)
    row["label"] = (sw.labels or {}).get(value, f"{sw.knob}={value:g}")
    row["sim_wall_s"] = time.perf_counter() - t
    return row


def run_sweeps(
    prep: Prepared,
    cfg: PolicyConfig,
    svc: ServiceModel,
    s: ReplaySettings,
    sweeps: tuple[Sweep, ...],
    progress: Callable[[str], None] = lambda _: None,
    jobs: int = 1,
) -> dict[str, list[dict]]:
    """Every (policy, knob value) simulated on the same arrivals; rows per policy, in sweep
    order. jobs > 1 runs the simulations in that many forked processes (results identical)."""
    global _SHARED
    _SHARED = (prep, cfg, svc, s)
    tasks = [(sw, v) for sw in sweeps for v in sw.values]
    out: dict[str, list[dict]] = {sw.policy: [] for sw in sweeps}
    t0 = time.perf_counter()
    pool = multiprocessing.get_context("fork").Pool(jobs) if jobs > 1 else None
    try:
        rows = pool.imap(_one, tasks) if pool else map(_one, tasks)
        for done, row in enumerate(rows, 1):
            out[row.pop("policy")].append(row)
            eta = (time.perf_counter() - t0) / done * (len(tasks) - done)
            progress(
                f"{done}/{len(tasks)} {tasks[done - 1][0].policy} {row['label']}: "
                f"{row['gpu_hours']:.0f} GPU-h, SLO {100 * row['slo_attainment']:.3f}% "
                f"({row['sim_wall_s']:.0f} s; ETA {eta:.0f} s)"
            )
    finally:
        if pool:
            pool.close()
            pool.join()
    return out


def gpu_hours_to_reach(rows: list[dict], slo: float) -> float | None:
    """Least GPU-hours at which the policy's frontier reaches `slo`: along the best attainment
    seen so far as GPU-hours grow, interpolated linearly between the two sweep points around it.
    None when no point reaches it (no extrapolation)."""
    pts = sorted((r["gpu_hours"], r["slo_attainment"]) for r in rows)
    best_g, best_a = None, -math.inf
    for g, a in pts:
        if a >= slo:
            if best_g is None or best_a >= slo:
                return g
            return best_g + (g - best_g) * (slo - best_a) / (a - best_a)
        if a > best_a:
            best_g, best_a = g, a
    return None


def violations_at(rows: list[dict], gpu_hours: float) -> float | None:
    """The policy's violating requests at `gpu_hours`, log-interpolated between the two sweep
    points around it on its frontier (the fewest violations at or below each cost). None outside
    the swept range."""
    pts = sorted((r["gpu_hours"], max(r["num_slo_violations"], 0.5)) for r in rows)
    env, least = [], math.inf
    for g, v in pts:
        least = min(least, v)
        env.append((g, least))
    if not env or gpu_hours < env[0][0] or gpu_hours > env[-1][0]:
        return None
    for (g0, v0), (g1, v1) in itertools.pairwise(env):
        if g0 <= gpu_hours <= g1:
            w = 0.0 if g1 == g0 else (gpu_hours - g0) / (g1 - g0)
            return math.exp((1 - w) * math.log(v0) + w * math.log(v1))
    return env[-1][1]
