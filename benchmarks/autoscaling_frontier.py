"""Cost/SLO frontier of autoscaling policies on real traces: each policy's one knob swept.

    python benchmarks/autoscaling_frontier.py [--quick] [--json PATH] [--plot [PNG]] [--profile P]
                                              [--admission] [--cold-starts FILE]

Setup (the same for every trace and every policy): train on days 1-7, judge the rest; the trace
scaled so its judged peak needs 20 replicas at the planning utilisation; cold start 120 s;
controllers tick every 10 s; per-second fluid queue (autoscaling/replay/service.py; simple model
20 rps per replica, or the calibrated capacity profile given with --profile); TTFT SLO 1.0 s.
tideserve runs with its default settings on every trace (HeadroomConfig, PolicyConfig defaults);
only the knob named below is swept, and its default is marked.

Per trace and policy: GPU-hours to reach 99.5% and 99.9% of requests within the SLO (frontier,
interpolated; none when never reached), and reactive's violations at tideserve's GPU-hours.
present_rate_reference: the same ratio for decide() told each window's true rate with a fixed
headroom multiple (autoscaling/replay/reference.py), a yardstick with hindsight of the present,
not a baseline (neither it nor the oracle counts among T2's baselines, docs/autoscaling.md).
rate_oracle, another yardstick, knows the rate curve the arrivals are drawn from (not the draws)
and holds what its next cold start needs plus the queue margin: what any forecast could buy.
violation_episodes (autoscaling/replay/episodes.py): for tideserve's default and the reactive
point nearest its GPU-hours, the share of violations in episodes that follow a step up of the
trace's 10-minute rate, and how long those last against one tick plus one cold start.
Arrivals (--arrivals, default interpolated): each 10-minute mean is kept, and the rate between
them is continuous (autoscaling/replay/arrivals.py); seed k draws its own Poisson arrivals and
moves the whole curve k x --phase-step-s (137 s, mod 600) later, so the trace's windows do not
sit on the controllers' tick or the forecaster's bins. Per seed: every target (T1, T2, T3b) and
violation-minutes; across seeds (autoscaling/replay/targets.py): T3a, the per-day difference in
violation-minutes against every baseline at tideserve's GPU-hours, with its 95% interval, and
references_judged_as_policies: T3a and T3b as if each yardstick were the policy; t3a_ceiling: the
T3a of a policy with no violation at all, per baseline point (where it is not above 0, nothing is).
--seeds 1 --arrivals steps is the earlier single-seed, piecewise-constant replay.
--quick: m-small only, days 8-9 judged, 3-5 knob values per policy (use --seeds 2).
--cold-starts FILE: each replica start draws its length from a benchmarks/cold_start.py result's
trials (autoscaling/replay/cold_starts.py); tideserve and the next-window yardstick plan on their
p95, the oracles on the longest; --sweeps full widens every knob's sweep (a short cold start moves
the baselines' crossings of 99.5% off the few points the per-seed sweep holds).
--admission: the replicas refuse (429) what would pass the 1.0 s SLO, as tideserve's serving path
does, instead of queueing it without bound; each refusal counts as a violation, and the policies
see the refusals (tideserve's emergency path reads their share, the baselines the arrival rate,
refused requests included). The default, an unbounded FIFO queue, is Ray Serve's own.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoscaling.headroom import HeadroomConfig
from autoscaling.policy import PolicyConfig
from autoscaling.replay.arrivals import ARRIVAL_SHAPES
from autoscaling.replay.cold_starts import ColdStarts
from autoscaling.replay.frontier import SWEEP_LEVELS, default_sweeps, gpu_hours_to_reach, run_sweeps
from autoscaling.replay.runner import ReplaySettings, prepare
from autoscaling.replay.service import ServiceModel
from autoscaling.replay.targets import (
    across_seeds,
    references_judged_as_policies,
    seed_targets,
    t3a_ceiling,
)
from autoscaling.replay.traces import load_trace
from benchmarks._common import TRACES_DIR, log, machine_info, write_json
from benchmarks._frontier_summary import summarise

CAP_RPS = 20.0
COLD_START_S = 120.0
TTFT_SLO_S = 1.0
TRACES = ("m-small", "m-large")
# hindsight no controller has: not baselines to beat, yardsticks (autoscaling/replay/frontier.py)
REFERENCES = ("oracle", "present_rate", "next_window", "rate_oracle")
# the traces folder's other shapes, and why they are not in the frontier
NOT_REPLAYED = {
    "azure_llm_2023_conv, azure_llm_2023_code": "one hour each: no training days to learn from"
}


def _service(args) -> ServiceModel:
    admit = {"admit_ttft_s": TTFT_SLO_S} if args.admission else {}
    if not args.profile:
        return ServiceModel(CAP_RPS, source="simple model (benchmark: 20 rps per replica)", **admit)
    from capacity.calibrate import Profile

    profile = Profile.load(args.profile)
    svc = ServiceModel.from_profile(
        profile, args.max_num_seqs, args.avg_input_tokens, args.avg_output_tokens
    )
    return replace(svc, **admit)


def run_seed(trace, name: str, seed: int, args, service: ServiceModel) -> dict:
    """One seed: Poisson draw `seed`, the curve moved `seed x --phase-step-s` seconds later."""
    cfg = PolicyConfig(replica_capacity_rps=service.replica_capacity_rps, ttft_slo_s=TTFT_SLO_S)
    phase = (seed * args.phase_step_s) % 600
    settings = ReplaySettings(
        scale_to_peak_replicas=20,
        cold_start_s=args.starts.median_s,
        cold_starts=args.starts,
        train_days=7.0,
        judge_days=2.0 if args.quick else None,
        seed=seed,
        arrival_shape=args.arrivals,
        phase_s=phase,
    )
    prep = prepare(trace, cfg, settings)
    log(f"{name} seed {seed} (phase {phase} s, {args.arrivals}): "
        f"{len(prep.arrivals) / 86400:.1f} days judged, peak {prep.peak_rps:.0f} rps")  # fmt: skip
    level = args.sweeps or ("quick" if args.quick else ("seeds" if args.seeds > 1 else "full"))
    sweeps = run_sweeps(
        prep, cfg, service, settings, default_sweeps(service, level), log, args.jobs
    )
    q = HeadroomConfig().quantile
    return {
        "seed": seed,
        "phase_s": phase,
        "judged_days": len(prep.arrivals) / 86400,
        "policy_config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "headroom_config": {
            k: getattr(settings.headroom, k) for k in settings.headroom.__dataclass_fields__
        },
        "sweeps": sweeps,
        **summarise(sweeps, q),
        "targets_by_seed": seed_targets(sweeps, q, gpu_hours_to_reach),
    }


def trace_report(trace, args, service: ServiceModel, seeds: list[dict]) -> dict:
    """One trace's report over the seeds replayed so far."""
    judged = across_seeds(
        [s["sweeps"] for s in seeds],
        HeadroomConfig().quantile,
        [s["targets_by_seed"] for s in seeds],
    )
    return {
        "trace": trace.name,
        "judged_days": seeds[0]["judged_days"],
        "train_days": 7.0,
        "cold_start_s": args.starts.median_s,
        "cold_starts": args.starts.describe(),
        "scale_to_peak_replicas": 20,
        "arrivals": args.arrivals,
        "service_model": service.describe(),
        "service_queue": "FIFO queue" if service.admit_ttft_s is None else "admission (429)",
        "ttft_slo_s": TTFT_SLO_S,
        "across_seeds": judged,
        # T3 as if each yardstick were the policy: what the targets need to be told
        "references_judged_as_policies": references_judged_as_policies(
            [s["sweeps"] for s in seeds], gpu_hours_to_reach
        ),
        # the most T3a any policy could score: a policy with no violation at all
        "t3a_ceiling": t3a_ceiling([s["sweeps"] for s in seeds]),
        "seeds": seeds,
        # the first seed's frontier, for the plot and for readers of earlier result files
        "sweeps": seeds[0]["sweeps"],
        "oracle_gpu_hours": seeds[0]["oracle_gpu_hours"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="m-small, 2 judged days, fewer points")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--plot", nargs="?", const="", default=None, help="PNG (default: by --json)")
    ap.add_argument("--profile", default=None, help="calibrated capacity profile (capacity CLI)")
    ap.add_argument("--admission", action="store_true", help="refuse (429) past the SLO")
    ap.add_argument("--jobs", type=int, default=1, help="simulations in parallel (processes)")
    ap.add_argument("--seeds", type=int, default=5, help="Poisson seeds, each phase-shifted")
    ap.add_argument("--arrivals", choices=ARRIVAL_SHAPES, default="interpolated")
    ap.add_argument(
        "--cold-starts",
        default=None,
        help="a benchmarks/cold_start.py result: each replica start draws one of its trials "
        "(default: every start takes 120 s)",
    )
    ap.add_argument(
        "--sweeps",
        choices=SWEEP_LEVELS,
        default=None,
        help="knob values swept (default: quick with --quick, seeds with --seeds > 1, else full)",
    )
    ap.add_argument("--phase-step-s", type=int, default=137, help="seed k: k x this, mod 600 s")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--avg-input-tokens", type=float, default=1000.0)
    ap.add_argument("--avg-output-tokens", type=float, default=200.0)
    args = ap.parse_args()
    args.starts = ColdStarts.load(args.cold_starts, COLD_START_S)  # read once, for every seed
    t0 = time.perf_counter()
    service = _service(args)
    names = TRACES[:1] if args.quick else TRACES
    traces = {n: load_trace(TRACES_DIR / f"servegen_language_{n}_total.csv") for n in names}
    done: dict[str, list[dict]] = {n: [] for n in names}
    machine = machine_info("cpu", "float64 (numpy replay)")
    # seed-major, and the file rewritten after every seed: a run cut short still holds every
    # trace at the seeds it finished (seeds_done says which)
    for k in range(args.seeds):
        for n in names:
            done[n].append(run_seed(traces[n], n, k, args, service))
            reports = [trace_report(traces[m], args, service, done[m]) for m in names if done[m]]
            out = {"benchmark": "autoscaling_frontier", "quick": args.quick, "reports": reports}
            out["seeds_requested"], out["phase_step_s"] = args.seeds, args.phase_step_s
            out["seeds_done"] = {m: len(done[m]) for m in names}
            out["traces_not_replayed"] = NOT_REPLAYED
            out["wall_s"] = time.perf_counter() - t0
            out["machine_info"] = machine
            out["machine_note"] = "shared machine (other jobs running); the replay is deterministic"
            if args.json:
                write_json(args.json, out)
    for rep in reports:
        print(rep["trace"], rep["across_seeds"]["targets"])
        for sd in rep["seeds"]:
            t = sd["targets_by_seed"]
            print(f"  seed {sd['seed']}: {100 * t['tideserve_slo_attainment']:.2f}% at "
                  f"{t['tideserve_gpu_hours_over_oracle']:.3f}x; to 99.5%:",
                  {p: None if v is None else round(v, 3)
                   for p, v in t["gpu_hours_to_99_5_over_oracle"].items()})  # fmt: skip
    if args.plot is not None:
        from autoscaling.replay.frontier_plot import plot_frontier

        png = args.plot or (str(Path(args.json).with_suffix(".png")) if args.json else "")
        png = png or "benchmarks/results/autoscaling_frontier.png"
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        plot_frontier(reports, png)
        out["plot"] = png
        log(f"plot: {png}")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
