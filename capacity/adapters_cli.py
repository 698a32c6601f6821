"""`python -m capacity adapters ...` (`tideserve adapters ...`): how many LoRA slots each replica
needs (engine.max_loras) for a count of adapters, their rank and their popularity, and what the
slots cost in device memory (capacity/adapters.py slots_per_replica).

Popularity is Zipf(s) over --num-adapters (the k-th most used adapter's weight 1/k^s), or a JSON
list of weights, one per adapter, in --popularity (a request count per adapter from a log).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from capacity.adapters import SlotPlan, slots_per_replica, zipf_popularity


def add_adapters_parser(sub) -> None:
    a = sub.add_parser(
        "adapters",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="LoRA slots per replica (engine.max_loras) for adapters of a given popularity",
    )
    a.add_argument("--num-adapters", type=int, default=None, help="adapters, Zipf popularity")
    a.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s of --num-adapters")
    a.add_argument("--popularity", default=None, help="JSON file: one weight per adapter")
    a.add_argument("--replicas", type=int, required=True, help="replicas serving the adapters")
    a.add_argument(
        "--running-per-replica", type=int, required=True, help="requests a replica runs at once"
    )
    a.add_argument("--max-miss-fraction", type=float, default=0.05, help="LRU misses allowed")
    a.add_argument("--model", default=None, help="model dir or config.json: the slots' bytes")
    a.add_argument("--dtype", default="bf16", help="with --model: the adapters' dtype")
    a.add_argument("--max-lora-rank", type=int, default=16, help="with --model: slot rank")
    a.add_argument("--json", action="store_true", help="print one JSON object")


def popularity_of(args: argparse.Namespace) -> list[float]:
    """The adapters' weights from --popularity or --num-adapters/--zipf (exactly one)."""
    if (args.popularity is None) == (args.num_adapters is None):
        raise ValueError("give either --num-adapters (Zipf popularity) or --popularity FILE")
    if args.popularity is not None:
        weights = json.loads(Path(args.popularity).read_text())
        if not isinstance(weights, list) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in weights
        ):
            raise ValueError(f"--popularity {args.popularity}: expected a JSON list of numbers")
        return [float(w) for w in weights]
    if args.num_adapters < 1:
        raise ValueError(f"--num-adapters={args.num_adapters} must be >= 1")
    if not math.isfinite(args.zipf) or args.zipf < 0:
        raise ValueError(f"--zipf={args.zipf} must be a finite number >= 0")
    return zipf_popularity(args.num_adapters, args.zipf)


def format_slots(plan: SlotPlan, num_adapters: int, args: argparse.Namespace) -> str:
    lines = [
        f"LoRA slots for {num_adapters} adapters over {args.replicas} replica(s), "
        f"{args.running_per_replica} running each",
        f"  engine.max_loras: {plan.slots}",
        f"  adapters homed on the busiest replica: {plan.adapters_per_replica}",
        f"  adapters among its running requests at once: {plan.distinct_running:.1f}",
        f"  predicted LRU misses: {plan.miss_fraction:.1%} of its adapter requests "
        f"(target {args.max_miss_fraction:.1%})",
    ]
    if plan.slot_bytes is not None:
        lines.append(
            f"  slot memory at rank {args.max_lora_rank}, {args.dtype}: "
            f"{plan.slot_bytes / 2**30:.3f} GiB per replica (set aside before the KV cache)"
        )
    return "\n".join(lines)


def adapters_main(args: argparse.Namespace) -> int:
    from capacity.cli import load_model_config

    try:
        popularity = popularity_of(args)
        config = None if args.model is None else load_model_config(args.model)
        plan = slots_per_replica(
            popularity,
            args.replicas,
            args.running_per_replica,
            args.max_miss_fraction,
            config=config,
            dtype=args.dtype if config is not None else None,
            max_lora_rank=args.max_lora_rank,
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = {f: getattr(plan, f) for f in SlotPlan.__dataclass_fields__}
        print(json.dumps({**out, "num_adapters": len(popularity)}))
    else:
        print(format_slots(plan, len(popularity), args))
    return 0
