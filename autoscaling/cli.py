"""`python -m autoscaling <command>`: replay (trace simulator), status (live controller)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoscaling.replay.cold_starts import ColdStarts
from autoscaling.replay.runner import POLICIES


def _add_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="replay a trace through tideserve's policy and baselines",
    )
    p.add_argument("--trace", required=True, help="Azure per-request CSV or ServeGen rate CSV")
    p.add_argument("--config", default="cluster.yaml", help="Ray Serve config with our args")
    p.add_argument("--app", default="tideserve", help="application name in the config")
    p.add_argument("--policy", action="append", choices=POLICIES, help="repeat; default: all")
    p.add_argument("--scale-to-peak-replicas", type=int, default=None)
    starts = p.add_mutually_exclusive_group()
    starts.add_argument("--cold-start-s", type=float, default=120.0, help="every start alike")
    starts.add_argument(
        "--cold-starts",
        default=None,
        help="a benchmarks/cold_start.py result file: each start draws one of its trials",
    )
    p.add_argument("--train-days", type=float, default=0.0)
    p.add_argument(
        "--replica-capacity-rps",
        type=float,
        default=None,
        help="override controller.replica_capacity_rps",
    )
    p.add_argument("--profile", default=None, help="capacity profile JSON (python -m capacity)")
    p.add_argument("--avg-input-tokens", type=float, default=1000.0)
    p.add_argument("--avg-output-tokens", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--offline-per-day",
        type=float,
        default=0.0,
        help="offline (batch) requests submitted each day, run on idle capacity; 0: none",
    )
    p.add_argument(
        "--offline-max-cold",
        type=int,
        default=0,
        help="extra replicas a day's batch may start off-peak when the valleys fall short",
    )
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--plot", default=None, help="write the timeline PNG here")
    p.set_defaults(func=cmd_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autoscaling", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_replay(sub)
    from autoscaling.status_cli import add_status_parser  # the cold pool policy's history

    add_status_parser(sub)
    return parser


def _service(args, app_cfg):
    from autoscaling.replay.service import ServiceModel

    if args.profile:
        from capacity.calibrate import Profile

        return ServiceModel.from_profile(
            Profile.load(args.profile),
            app_cfg.engine.max_num_seqs,
            args.avg_input_tokens,
            args.avg_output_tokens,
        )
    cap = args.replica_capacity_rps or app_cfg.controller.replica_capacity_rps
    return ServiceModel(
        cap, source="simple model, capacity from cluster.yaml or --replica-capacity-rps"
    )


def cmd_replay(args) -> int:
    from autoscaling.policy import PolicyConfig
    from autoscaling.replay.offline import OfflineLoad
    from autoscaling.replay.runner import ReplaySettings, run_replay
    from autoscaling.replay.traces import load_trace
    from serving.config import load_cluster_yaml

    app_cfg = load_cluster_yaml(args.config, args.app)
    service = _service(args, app_cfg)
    starts = ColdStarts.load(args.cold_starts, args.cold_start_s)
    cfg = PolicyConfig.from_app_config(app_cfg, replica_capacity_rps=service.replica_capacity_rps)
    settings = ReplaySettings(
        policies=tuple(args.policy or POLICIES),
        scale_to_peak_replicas=args.scale_to_peak_replicas,
        cold_start_s=starts.median_s,
        cold_starts=starts,
        train_days=args.train_days,
        interval_s=max(round(app_cfg.controller.interval_s), 1),
        seed=args.seed,
        offline=OfflineLoad(args.offline_per_day, max_cold_replicas=args.offline_max_cold)
        if args.offline_per_day > 0
        else None,
    )
    report, results, prep = run_replay(load_trace(args.trace), cfg, service, settings)
    print(format_report(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.plot:
        from autoscaling.replay.plot import plot_timeline

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_timeline(report, results, prep, args.plot)
    return 0


def _cold_start_line(starts: dict) -> str:
    if ColdStarts(tuple(starts["samples_s"])).is_constant:
        return f"cold start: {starts['median_s']:.0f} s, every start alike"
    return (
        f"cold starts drawn from {starts['source']}: median {starts['median_s']:.1f} s, "
        f"p95 {starts['p95_s']:.1f} s (tideserve's lead: it + the margin), "
        f"longest {starts['max_s']:.1f} s"
    )


def format_report(report: dict) -> str:
    lines = [
        f"trace {report['trace']} ({report['trace_kind']}), judged "
        f"{report['judged_span_s'] / 86400:.2f} days after {report['train_days']} training days; "
        f"scale x{report['scale']:.4g}; {report['num_gap_windows']} gap windows (not scored)",
        f"model: {report['service_model']}; arrivals: {report['arrival_model']}; "
        f"step {report['step_s']:.0f} s, controllers tick every {report['interval_s']} s",
        _cold_start_line(report["cold_starts"]),
        f"{'policy':<12} {'GPU-h':>9} {'SLO ok':>8} {'viol. req':>11} {'TTFT p99':>9} "
        f"{'events':>7} {'hot':>4} {'max':>4}",
    ]
    for r in report["policies"]:
        lines.append(
            f"{r['name']:<12} {r['gpu_hours']:>9.1f} {100 * r['slo_attainment']:>7.2f}% "
            f"{r['num_slo_violations']:>11.0f} {r['ttft_p99_s']:>8.2f}s "
            f"{r['num_scale_events']:>7} {r['hot_replicas']:>4} {r['max_replicas']:>4}"
        )
    for r in report["policies"]:
        if "offline" in r:
            o = r["offline"]
            lines.append(
                f"offline {r['name']:<12} {o['valley_gpu_hours_used']:.1f} valley GPU-h used of "
                f"{o['idle_gpu_hours_before']:.1f} idle; {o['offline_served']:.0f} requests; "
                f"{o['days_batch_done']}/{o['days_judged']} days' batches done in their day; "
                f"cold started {o['days_cold_started']} days, "
                f"{o['cold_gpu_hours_for_batch']:.1f} GPU-h"
            )
    lines.append(f"wall {report['wall_s']:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
