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
        help="set pools.hot.num_replicas / pools.cold.max_replicas in this cluster.yaml in place",
    )


def write_plan_outputs(args: argparse.Namespace, inputs: PlanInputs, result: Plan) -> int:
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
        from capacity.cluster_yaml import write_pools

        try:
            summary = write_pools(
                args.write_cluster_yaml, result.hot_replicas, result.cold_max_replicas
            )
            print(f"updated {summary}", file=out)
        except (ValueError, OSError) as exc:
            print(f"error: --write-cluster-yaml: {exc}", file=sys.stderr)
            rc = 2
    return rc
