"""`python -m autoscaling status`: what the running controller forecasts, targets and why.

Connects to the running cluster (`ray.init(address="auto")`), finds the app's named controller
actor and prints its `status()`; `--json` prints the raw dict. Ray 2.60 clusters started with
`ray start` use token auth: run with `RAY_AUTH_MODE=token` (the token is read from
~/.ray/auth_token), as for `serve status`.
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
        help="forecast, targets and last reasons of the live controller",
    )
    p.add_argument(
        "--app", default="tideserve", help="Serve application name (controller.app_name)"
    )
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    import ray

    from autoscaling.controller import get_controller

    try:
        ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    except Exception as err:  # no cluster, or token auth refused us
        print(
            f"error: cannot connect to Ray at {args.address!r}: {err}\n"
            "hint: start a cluster first; with token auth set RAY_AUTH_MODE=token",
            file=sys.stderr,
        )
        return 2
    try:
        status = ray.get(get_controller(args.app).status.remote(), timeout=30)
    except ValueError:
        print(
            f"error: no forecast controller for application {args.app!r}; it starts with an "
            "app whose cluster.yaml has a `controller:` section",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(status, indent=2, default=str) if args.json else format_status(status))
    return 0


def _clock(t_s: float | None) -> str:
    if t_s is None:
        return "-"
    return dt.datetime.fromtimestamp(t_s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def format_status(status: dict[str, Any]) -> str:
    last = status.get("last", {})
    clock = status.get("clock") or {}
    p95 = status.get("cold_start_p95_s")
    lines = [
        f"application   {status['app']}   (controller {last.get('state', '?')}, "
        f"time x{clock.get('time_scale', 1.0):g})",
        f"model time    {_clock(status.get('model_now_s'))}",
        f"targets       {status.get('applied_targets')}  via {status.get('apply_path')}",
        f"cold start    p95 {'-' if p95 is None else f'{p95:.1f} s'} over "
        f"{len(status.get('cold_start_samples_s', []))} samples; "
        f"{status.get('pending_cold_starts', 0)} pending",
    ]
    if "forecast" in last:
        fc = last["forecast"]
        rate = last.get("rate_rps")
        lines += [
            f"traffic       {'-' if rate is None else f'{rate:.2f}'} rps now; queue "
            f"{last.get('queue_depth')} waiting, wait p99 {last.get('queue_wait_s', 0):.2f} s",
            f"forecast      {fc['rate_at_lead_rps']:.2f} rps at +{last['lead_s']:.0f} s, "
            f"peak {fc['peak_rps']:.2f} rps ({fc['basis']})",
            f"running       hot {last.get('hot_running')}, cold {last.get('cold_running')}",
        ]
    lines.append("last reasons:")
    lines += [f"  - {reason}" for reason in status.get("recent_reasons", [])] or ["  (none yet)"]
    for err in status.get("errors", []):
        lines.append(f"error: {err}")
    lines.append(f"history       {status.get('history_path')}")
    return "\n".join(lines)
