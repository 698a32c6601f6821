"""`tideserve doctor`: read a running LLM app's replicas, print the R10 verdict (llm/doctor.py).

Connects to the running cluster (`ray.init(address="auto")`; with Ray 2.60's token auth run it
with `RAY_AUTH_MODE=token`, as for `serve status`), asks every running replica of the hot and cold
deployments for its `reading()` (config, KV ledger, last step window: the numbers its metrics
export) and prints the verdict; `--json` prints it as one JSON object. A replica's step window
closes every 5 s, so run it once traffic has flowed for that long. Exit status: 0 healthy,
1 a check failed or warned (the verdict names it), 2 no replica answered.
"""

from __future__ import annotations

import argparse
import json
import sys

from serving.llm.doctor import diagnose, format_verdict
from serving.llm.messages import ReplicaReading

POOLS = ("hot", "cold")


def collect_readings(app: str, timeout_s: float = 30.0) -> list[ReplicaReading]:
    """One reading per running replica of each pool (handle calls until each replica answered;
    Serve picks the replica, so a pool of N is asked up to 4N times)."""
    from ray import serve

    from serving.serve_status import running_replicas

    running = running_replicas(app)
    readings: dict[str, ReplicaReading] = {}
    for pool in POOLS:
        count = running.get(pool, 0)
        if count == 0:
            continue
        handle = serve.get_deployment_handle(pool, app)
        seen: set[str] = set()
        for _ in range(4 * count):
            reading = handle.reading.remote().result(timeout_s=timeout_s)
            seen.add(reading.replica_id)
            readings[f"{pool}/{reading.replica_id}"] = reading
            if len(seen) >= count:
                break
    return list(readings.values())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tideserve doctor",
        description="R10 triage of a running app: config, memory, queue, compute.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--app", default="tideserve", help="Serve application name")
    p.add_argument("--address", default="auto", help="Ray cluster address")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import ray

    if not ray.is_initialized():
        try:
            ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
        except Exception as err:  # no cluster, or token auth refused us
            print(
                f"error: cannot connect to Ray at {args.address!r}: {err}\n"
                "hint: start the app first; with token auth set RAY_AUTH_MODE=token",
                file=sys.stderr,
            )
            return 2
    verdict = diagnose(collect_readings(args.app))
    print(
        json.dumps(verdict.to_dict(), indent=2) if args.json else format_verdict(verdict, args.app)
    )
    if verdict.cause == "no_replicas":
        return 2
    return 0 if verdict.cause == "healthy" else 1


if __name__ == "__main__":
    raise SystemExit(main())
