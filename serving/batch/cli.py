"""`tideserve batches`: the batches of a running app, their progress and the lane's state.

    tideserve batches [--url http://127.0.0.1:8000] [--api-key-env NAME] [--json] [--limit N]

It reads GET /v1/batches (the OpenAI listing, with tideserve's numbers under `tideserve`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

COLUMNS = ("id", "status", "done/total", "failed", "tokens", "idle_rep_s", "eta_utc", "window")


def _eta(value: float | None) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%H:%M:%S")


def rows(listing: dict) -> list[tuple[str, ...]]:
    out = []
    for batch in listing.get("data", []):
        counts, extra = batch["request_counts"], batch.get("tideserve") or {}
        done = counts["completed"] + counts["failed"]
        out.append(
            (
                batch["id"],
                batch["status"],
                f"{done}/{counts['total']}",
                str(counts["failed"]),
                str(extra.get("tokens_done", 0)),
                f"{extra.get('idle_capacity_used_replica_s', 0.0):.1f}",
                _eta(extra.get("estimated_completion_at")),
                batch["completion_window"],
            )
        )
    return out


def format_table(listing: dict) -> str:
    table = [COLUMNS, *rows(listing)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lane = listing.get("tideserve") or {}
    if lane:
        lines.append(
            f"lane: {lane.get('lane_reason', '-')}; idle capacity used "
            f"{lane.get('idle_capacity_used_replica_s', 0.0):.1f} replica-s; "
            f"store {lane.get('store_path', '-')}"
        )
        lines.append(
            f"cold pool: {lane.get('cold_replicas_asked', 0)} replica(s) asked "
            f"({lane.get('cold_reason', '-')})"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(prog="tideserve batches", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the app's base URL")
    parser.add_argument("--api-key-env", default=None, help="env var holding the API key")
    parser.add_argument("--limit", type=int, default=100, help="batches to list (newest first)")
    parser.add_argument("--json", action="store_true", help="print the raw listing")
    args = parser.parse_args(argv)
    headers = {}
    if args.api_key_env:
        headers["authorization"] = f"Bearer {os.environ.get(args.api_key_env, '')}"
    url = args.url.rstrip("/") + "/v1/batches"
    try:
        reply = httpx.get(url, params={"limit": args.limit}, headers=headers, timeout=30)
    except httpx.HTTPError as err:
        print(f"tideserve batches: {url}: {err}", file=sys.stderr)
        return 1
    if reply.status_code != 200:
        print(f"tideserve batches: {url}: HTTP {reply.status_code} {reply.text}", file=sys.stderr)
        return 1
    listing = reply.json()
    print(json.dumps(listing, indent=2) + "\n" if args.json else format_table(listing), end="")
    return 0
