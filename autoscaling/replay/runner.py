"""Replay a real trace through tideserve's policy and the baselines in one run (pure numpy).

    arrivals  per-second requests: a rate series (ServeGen) is a per-second rate curve with the
              trace's window means (held per window, or interpolated and phase-shifted:
              autoscaling/replay/arrivals.py) with Poisson arrivals around it (seeded, the same
              for every policy); a per-request trace
              (Azure) gives exact per-second counts. Both are multiplied by `scale`.
    training  the first `train_days` are only observed (tideserve's forecaster, its hot pool
              size and rule_70_30's peak are learned there); the rest is judged.
    gaps      missing windows are simulated at the interpolated rate, but no controller sees them
              and no request in them is scored.

Metrics per policy: GPU-hours (every replica holding a GPU, starting ones included), SLO
attainment (share of judged requests whose TTFT <= the interactive TTFT SLO), p99 TTFT, the
number of scale events (changes of the elastic target), emergencies.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from autoscaling.forecast import ForecastConfig, Forecaster
from autoscaling.headroom import HeadroomConfig
from autoscaling.policy import PolicyConfig
from autoscaling.replay import judge
from autoscaling.replay.arrivals import ARRIVAL_SHAPES, rate_curve, shifted
from autoscaling.replay.baselines import (
    KnativeController,
    OracleController,
    ReactiveController,
    StaticController,
    replicas_for,
)
from autoscaling.replay.cold_starts import ColdStarts
from autoscaling.replay.offline import OfflineLoad, fill_valleys
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.sim import SimResult, simulate
from autoscaling.replay.tideserve import TideserveController, learn_hot_replicas
from autoscaling.replay.traces import RateTrace

POLICIES = (
    "tideserve",
    "static_peak",
    "static_mean",
    "reactive",
    "knative",
    "rule_70_30",
    "oracle",
)


@dataclass(frozen=True)
class ReplaySettings:
    policies: tuple[str, ...] = POLICIES
    scale_to_peak_replicas: int | None = None  # scale so the judged peak needs this many
    cold_start_s: float = 120.0
    # measured starts, each replica drawing one (autoscaling/replay/cold_starts.py); None: every
    # start takes cold_start_s. When set, cold_start_s must be their median (what is reported)
    cold_starts: ColdStarts | None = None
    train_days: float = 0.0
    judge_days: float | None = None  # None: everything after the training days
    interval_s: int = 10  # controller tick (cluster.yaml controller.interval_s)
    seed: int = 0
    # tideserve's hot pool: replicas for the rate exceeded 98% of the training time. A floor
    # the cold pool's forecast and headroom build on; a higher one idles at every trough (0.05
    # held a sixth replica on m-large that cost 1.4% of its GPU-hours for no SLO gain)
    hot_quantile: float = 0.02
    headroom: HeadroomConfig = field(default_factory=HeadroomConfig)  # tideserve's learner
    forecast: ForecastConfig = field(default_factory=ForecastConfig)  # tideserve's forecaster
    max_replicas_factor: float = 2.0  # every elastic policy may grow to this x the peak need
    offline: OfflineLoad | None = None  # a daily batch on the idle capacity (replay/offline.py)
    # a rate series' shape inside its windows (autoscaling/replay/arrivals.py): "steps" holds
    # each mean, "interpolated" is continuous with the same means; phase_s moves it later
    arrival_shape: str = "steps"
    phase_s: int = 0

    def __post_init__(self) -> None:
        if self.arrival_shape not in ARRIVAL_SHAPES:
            raise ValueError(
                f"arrival_shape={self.arrival_shape!r} is not known; choose from {ARRIVAL_SHAPES}"
            )
        if self.phase_s < 0:
            raise ValueError(f"phase_s={self.phase_s} is out of range; allowed: >= 0")
        if self.cold_starts is not None and self.cold_start_s != self.cold_starts.median_s:
            raise ValueError(
                f"cold_start_s={self.cold_start_s} disagrees with cold_starts (median "
                f"{self.cold_starts.median_s} s); with measured starts set it to their median"
            )
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"policies={unknown!r} are not known; choose from {list(POLICIES)}")

    @property
    def starts(self) -> ColdStarts:
        """The cold starts the replay draws from: the measured ones, or cold_start_s alone."""
        return self.cold_starts or ColdStarts.constant(self.cold_start_s)

    @property
    def oracle_look_s(self) -> int:
        """How far ahead the oracles hold capacity: the longest start (they know every one)
        and one tick."""
        return math.ceil(self.starts.max_s) + self.interval_s


@dataclass
class Prepared:
    arrivals: np.ndarray  # judged span, per second, scaled
    observed: np.ndarray  # the same with NaN in gaps
    scored: np.ndarray  # bool per second: not in a gap
    train_rates: np.ndarray  # scaled window means of the training days (NaN = gap)
    t0_s: float  # time of day-zero clock of the first judged second
    scale: float
    peak_rps: float  # the judged span's highest window rate, scaled
    bin_s: int  # the trace's window (train_rates are its means): its rate steps at these edges
    rate_s: np.ndarray  # judged span, per second: the mean rate the arrivals are drawn from


def prepare(trace: RateTrace, cfg: PolicyConfig, s: ReplaySettings) -> Prepared:
    n_train = round(s.train_days * 86400 / trace.bin_s)
    if n_train >= len(trace.rates_rps):
        raise ValueError(f"train_days={s.train_days} leaves nothing of {trace.name} to judge")
    n_end = len(trace.rates_rps)
    if s.judge_days is not None:
        n_end = min(n_end, n_train + round(s.judge_days * 86400 / trace.bin_s))
    judged = trace.rates_rps[n_train:n_end]
    peak = float(np.nanmax(judged))
    scale = 1.0
    if s.scale_to_peak_replicas is not None:
        scale = s.scale_to_peak_replicas * cfg.replica_capacity_rps * cfg.target_utilization / peak
    rep = int(trace.bin_s)
    if trace.kind == "rate_series":
        # the whole trace's curve, so a phase shift moves training and judged days alike
        curve = rate_curve(trace.gaps_filled() * scale, rep, s.arrival_shape, s.phase_s)
        gap = shifted(np.repeat(np.isnan(trace.rates_rps), rep).astype(float), s.phase_s) > 0
        rate_s = curve[n_train * rep : n_end * rep]
        arrivals = np.random.default_rng(s.seed).poisson(rate_s).astype(float)
        train_curve = curve[: n_train * rep].reshape(n_train, rep).mean(axis=1)
        train_gap = gap[: n_train * rep].reshape(n_train, rep).all(axis=1)
        train = np.where(train_gap, np.nan, train_curve)
        if s.arrival_shape == "steps" and s.phase_s == 0:
            train = trace.rates_rps[:n_train] * scale  # the same windows, bit for bit
        scored = ~gap[n_train * rep : n_end * rep]
    else:
        arrivals = np.repeat(trace.gaps_filled()[n_train:n_end] * scale, rep)
        rate_s = arrivals
        scored = np.repeat(~np.isnan(judged), rep)
        train = trace.rates_rps[:n_train] * scale
    observed = np.where(scored, arrivals, np.nan)
    t0 = trace.start_s + n_train * trace.bin_s
    return Prepared(arrivals, observed, scored, train, t0, scale, peak * scale, rep, rate_s)


def _controllers(prep: Prepared, cfg: PolicyConfig, service: ServiceModel, s: ReplaySettings):
    cap, u = service.replica_capacity_rps, cfg.target_utilization
    # static sizes read the judged span itself (hindsight): its highest window rate
    peak_rate = prep.peak_rps
    peak_n = replicas_for(peak_rate, cap, u)
    max_n = max(math.ceil(peak_n * s.max_replicas_factor), 1)
    mean_n = max(replicas_for(float(prep.arrivals.mean()), cap, u), 1)
    train_peak = float(np.nanmax(prep.train_rates)) if len(prep.train_rates) else peak_rate
    hot70 = max(math.ceil(0.7 * replicas_for(train_peak, cap, u)), 1)
    if len(prep.train_rates):
        hot = learn_hot_replicas(prep.train_rates, cfg, s.hot_quantile)
    else:
        hot = cfg.hot_replicas
    e2e = service.mean_e2e_s
    out = {}
    for name in s.policies:
        if name == "tideserve":
            tcfg = PolicyConfig(
                **{**_fields(cfg), "hot_replicas": hot, "max_cold_replicas": max(max_n - hot, 0)}
            )
            ctl = TideserveController(
                tcfg, Forecaster(s.forecast), cold_start_p95_s=s.starts.p95_s, headroom=s.headroom
            )
            if len(prep.train_rates):
                ctl.train(
                    prep.t0_s - len(prep.train_rates) * prep.bin_s, prep.bin_s, prep.train_rates
                )
            out[name] = ctl
        elif name == "static_peak":
            out[name] = StaticController(name, peak_n)
        elif name == "static_mean":
            out[name] = StaticController(name, mean_n)
        elif name == "reactive":
            out[name] = ReactiveController(name, cap, u, e2e, hot_replicas=1, max_replicas=max_n)
        elif name == "knative":
            out[name] = KnativeController(name, cap, u, e2e, max_replicas=max_n)
        elif name == "rule_70_30":
            out[name] = ReactiveController(
                name, cap, u, e2e, hot_replicas=hot70, max_replicas=max_n
            )
        elif name == "oracle":
            out[name] = OracleController(name, prep.arrivals, prep.t0_s, cap, s.oracle_look_s)
    return out


def _fields(cfg: PolicyConfig) -> dict:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def metrics(res: SimResult, prep: Prepared, slo_s: float) -> dict:
    total = float(np.where(prep.scored, prep.arrivals, 0.0).sum())
    # refused requests (429) are violations; the p99 is the admitted requests' TTFT
    w = np.where(prep.scored, prep.arrivals - res.refused, 0.0)
    ok = float(w[res.ttft_s <= slo_s].sum())
    bad_s = judge.violating_seconds(res.ttft_s, prep.arrivals, prep.scored, res.refused, slo_s)
    order = np.argsort(res.ttft_s)
    cum = np.cumsum(w[order])
    p99 = float(res.ttft_s[order][np.searchsorted(cum, 0.99 * cum[-1])]) if cum[-1] else math.nan
    return {
        "name": res.name,
        "gpu_hours": float(res.replicas.sum() / 3600.0),
        "slo_attainment": ok / total if total else math.nan,
        "ttft_p99_s": p99,
        "num_scale_events": res.num_scale_events,
        "num_slo_violations": total - ok,
        "violation_minutes": float(bad_s.sum() / 60.0),
        "num_refused": float(np.where(prep.scored, res.refused, 0.0).sum()),
        "num_requests": total,
        "num_emergencies": res.num_emergencies,
        "mean_replicas": float(res.replicas.mean()),
        "max_replicas": int(res.replicas.max()),
        "hot_replicas": int(res.ready.min()) if res.name == "static_peak" else None,
        "last_reasons": res.reasons,
    }


def run_replay(
    trace: RateTrace, cfg: PolicyConfig, service: ServiceModel, s: ReplaySettings
) -> tuple[dict, dict[str, SimResult], Prepared]:
    t_start = time.perf_counter()
    prep = prepare(trace, cfg, s)
    ctls = _controllers(prep, cfg, service, s)
    results, rows = {}, []
    for name, ctl in ctls.items():
        t = time.perf_counter()
        res = simulate(
            ctl, prep.arrivals, prep.observed, prep.t0_s, service, s.interval_s, s.cold_start_s,
            draw_cold_starts=s.starts.sampler(s.seed),
        )  # fmt: skip
        row = metrics(res, prep, cfg.ttft_slo_s)
        row["hot_replicas"] = ctl.hot_replicas
        row["sim_wall_s"] = time.perf_counter() - t
        if s.offline is not None:
            cap = service.replica_capacity_rps
            row["offline"] = fill_valleys(prep.arrivals, res.ready, prep.t0_s, cap, s.offline)
        results[name], rows = res, [*rows, row]
    report = {
        "trace": trace.name,
        "trace_kind": trace.kind,
        "span_s": trace.span_s,
        "judged_span_s": float(len(prep.arrivals)),
        "train_days": s.train_days,
        "num_gap_windows": trace.num_gaps,
        "scale": prep.scale,
        "scale_to_peak_replicas": s.scale_to_peak_replicas,
        "cold_start_s": s.cold_start_s,
        "cold_starts": s.starts.describe(),
        "interval_s": s.interval_s,
        "step_s": 1.0,
        "service_model": service.describe(),
        "arrival_model": f"Poisson around the window means ({s.arrival_shape}, phase "
        f"{s.phase_s} s, seed {s.seed})"
        if trace.kind == "rate_series"
        else "exact per-second counts",
        "ttft_slo_s": cfg.ttft_slo_s,
        "replica_capacity_rps": service.replica_capacity_rps,
        "policy_config": _fields(cfg),
        "policies": rows,
        "wall_s": time.perf_counter() - t_start,
    }
    return report, results, prep
