"""`plan --plot PATH` and `plan --write-cluster-yaml PATH`: files written from a finished plan.

Kept out of `capacity/cli.py` so the CLI only registers the flags and calls `write_plan_outputs`.
With `--json` the messages go to stderr so stdout stays one JSON object.
"""

from __future__ import annotations

import argparse
import sys

from capacity.planner import Plan, PlanInputs


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plot", metavar="PATH", default=None, help="write a PNG: memory split + concurrency"
    )
    p.add_argument(
        "--write-cluster-yaml",
        metavar="PATH",
        default=None,
        help="write the plan's engine limits, pool sizes and per-replica capacity into this "
        "cluster.yaml in place (comments and layout kept)",
    )
    p.add_argument(
        "--app",
        default=None,
        help="with --write-cluster-yaml: the application to write (default: the only LLM app)",
    )
    p.add_argument(
        "--pin-kv-bytes",
        action="store_true",
        help="with --write-cluster-yaml: write the plan's KV region as engine.kv_cache_bytes "
        "instead of null (null: a GPU replica sizes KV from its measured free memory)",
    )


def write_plan_outputs(
    args: argparse.Namespace, inputs: PlanInputs, result: Plan, measured_rps: float | None = None
) -> int:
    """Write what --plot / --write-cluster-yaml ask for; 0 on success, 2 on an error (printed)."""
    out = sys.stderr if getattr(args, "json", False) else sys.stdout
    rc = 0
    if getattr(args, "plot", None):
        try:
            from capacity.plot import plot_plan

            print(f"plot: wrote {plot_plan(inputs, result, args.plot)}", file=out)
        except ImportError as exc:
            print(f"error: --plot needs matplotlib ({exc})", file=sys.stderr)
            rc = 2
        except OSError as exc:
            print(f"error: --plot: {exc}", file=sys.stderr)
            rc = 2
    if getattr(args, "write_cluster_yaml", None):
        from capacity.cluster_yaml import write_plan
        from capacity.plan_settings import plan_settings

        try:
            pin = getattr(args, "pin_kv_bytes", False)
            settings = plan_settings(result, pin_kv_bytes=pin, measured_rps=measured_rps)
            summary = write_plan(args.write_cluster_yaml, settings, getattr(args, "app", None))
            print(f"updated {summary}", file=out)
        except (ValueError, OSError) as exc:
            print(f"error: --write-cluster-yaml: {exc}", file=sys.stderr)
            rc = 2
    return rc
