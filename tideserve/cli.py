"""`tideserve <command>`: one entry point over the project's command-line tools.

    tideserve plan ...        capacity plan (python -m capacity plan)
    tideserve calibrate ...   measure step costs on this device (python -m capacity calibrate)
    tideserve adapters ...    LoRA slots per replica (python -m capacity adapters)
    tideserve replay ...      replay a traffic trace (python -m autoscaling replay)
    tideserve status ...      the live forecast autoscaler (python -m autoscaling status)
    tideserve doctor ...      R10 triage of a running app: the one knob to turn
    tideserve batches ...     batches of a running app: progress, tokens, idle capacity used

Each command keeps its `python -m` form; `tideserve <command> --help` shows its options and
their defaults.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _capacity(argv: list[str]) -> int:
    from capacity.cli import main

    return main(argv)


def _autoscaling(argv: list[str]) -> int:
    from autoscaling.cli import main

    return main(argv)


def _doctor(argv: list[str]) -> int:
    from serving.llm.doctor_cli import main

    return main(argv[1:])


def _batches(argv: list[str]) -> int:
    from serving.batch.cli import main

    return main(argv[1:])


# command -> (runner taking the full argv of its `python -m` form, one-line help)
COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "plan": (_capacity, "memory budget, roofline throughput and replicas at peak"),
    "calibrate": (_capacity, "measure engine step costs on this device, save a profile"),
    "adapters": (_capacity, "LoRA slots per replica (engine.max_loras) for adapter popularity"),
    "replay": (_autoscaling, "replay a traffic trace through the policies"),
    "status": (_autoscaling, "forecast, targets and last reasons of the live autoscaler"),
    "doctor": (_doctor, "R10 triage of a running app: config, memory, queue, compute"),
    "batches": (_batches, "batches of a running app: progress, tokens, idle capacity used"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "usage: tideserve <command> [options]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    command = args[0]
    if command not in COMMANDS:
        print(f"tideserve: unknown command {command!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    run, _ = COMMANDS[command]
    return run(args) or 0


if __name__ == "__main__":
    raise SystemExit(main())
