"""`python -m autoscaling status`: what the cold pool's policy forecasts, targets and why.

Reads the policy's history file (autoscaling/history_store.py), which the policy rewrites on
every change and every 30 s: the last decisions with their forecast, reason and the policy's
cold-start measurements. No Ray connection is needed; run it on the node of Serve's controller
(the head node) or point `--history` at the file (`controller.history_path`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any


def add_status_parser(sub) -> None:
    p = sub.add_parser(
        "status",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="forecast, targets and last reasons of the cold pool's policy",
    )
    p.add_argument(
        "--app", default="tideserve", help="Serve application name (controller.app_name)"
    )
    p.add_argument("--history", default=None, help="history file (default: the app's default path)")
    p.add_argument("--json", action="store_true", help="print the last decision as JSON")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    from autoscaling.history_store import default_history_path, load_history

    path = args.history or default_history_path(args.app)
    try:
        history = load_history(path)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if history is None or not history.decisions:
        print(
            f"error: no decisions in {path}: the policy writes them once the app serves; "
            "is `controller:` in the app's args and `autoscaling_policy` in its Serve config?",
            file=sys.stderr,
        )
        return 2
    decisions = history.decisions
    if args.json:
        print(json.dumps(decisions[-1], indent=2, default=str))
    else:
        print(format_status(args.app, path, decisions))
    return 0


def _clock(t_s: float | None) -> str:
    if t_s is None:
        return "-"
    return dt.datetime.fromtimestamp(t_s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def format_status(app: str, path: str, decisions: list[dict[str, Any]]) -> str:
    last = decisions[-1]
    policy = last.get("policy") or {}
    p95 = policy.get("cold_start_p95_s")
    fc, rate = last["forecast"], last.get("rate_rps")
    lines = [
        f"application   {app}   (time x{policy.get('time_scale') or 1.0:g})",
        f"model time    {_clock(last.get('t_model_s'))}",
        f"targets       hot {last['hot_target']}, cold {last['cold_target']}",
        f"cold start    p95 {'-' if p95 is None else f'{p95:.1f} s'} over "
        f"{len(policy.get('cold_start_samples_s', []))} samples; "
        f"{policy.get('pending_cold_starts', 0)} pending",
        f"traffic       {'-' if rate is None else f'{rate:.2f}'} rps now; queue "
        f"{last.get('queue_depth')} waiting, wait p99 {last.get('queue_wait_s', 0):.2f} s",
        f"forecast      {fc['rate_at_lead_rps']:.2f} rps at +{last['lead_s']:.0f} s, "
        f"peak {fc['peak_rps']:.2f} rps ({fc['basis']})",
        f"running       hot {last.get('hot_running')}, cold {last.get('cold_running')}",
    ]
    capacity = last.get("capacity_rps")
    if capacity is not None:  # records before the capacity model was stored have none
        miss_ms = 1000 * (last.get("adapter_miss_s_per_request") or 0.0)
        lines.append(
            f"capacity      {capacity:.3g} rps per replica planned with "
            f"(adapter slot loads {miss_ms:.0f} ms/request)"
        )
    lines.append("last reasons:")
    lines += [f"  - {d['reason']}" for d in decisions[-5:]]
    lines.append(f"history       {path}")
    return "\n".join(lines)
