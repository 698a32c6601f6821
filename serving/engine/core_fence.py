"""Keep a pinned replica's model cores for its model thread: the node's other Ray processes (the
raylet and every worker it started: HTTP proxy, ingress, Serve's controller, the embedding
replica) move onto the reserved cores.

Why: `apply_layout` pins the replica's torch thread to the model cores and the rest of its own
process to the reserved ones, but the other processes of the node keep every core, and the OS
runs the proxy and the ingress on the model core too. `benchmarks/peer_http.py` read the hot
replica's torch thread waiting for a CPU 12.8% of a run (`hot_replica_busiest_thread`:
runqueue_wait_s 8.3 of 68 s, from schedstat) although its core was "its own". vLLM's CPU build
fences the same way from the other side: its API server stays off the model core.

Only the raylet's process tree moves: the replica's parent is the raylet (a worker), and every
later worker forks from it and inherits the reserved cores. Processes outside the Ray node (the
shell, a load generator) are left alone. Threads only move off the model cores, never onto more
cores than they had. Called only for a pinned layout, i.e. where the replica reserved the whole
node from Ray (torch_thread.core_layout), so no other model replica's cores are taken.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

log = logging.getLogger(__name__)


def descendants(parent_of: Mapping[int, int], root: int) -> set[int]:
    """`root` and every process below it, from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _parent_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # comm may hold spaces and parentheses: the fields after its last ')'
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry)] = int(fields[1])
    return out


def _threads(pid: int) -> Iterable[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def fence_node(model_cores: Sequence[int], other_cores: Sequence[int]) -> int:
    """Move every thread of the raylet's process tree (this process excepted: apply_layout placed
    its threads) that may run on a model core onto `other_cores`; returns how many moved."""
    model, other = set(model_cores), set(other_cores)
    if not other or not os.path.isdir("/proc"):
        return 0
    me = os.getpid()
    moved = 0
    for pid in descendants(_parent_map(), os.getppid()) - {me}:
        for tid in _threads(pid):
            try:
                if os.sched_getaffinity(tid) & model:
                    os.sched_setaffinity(tid, other)
                    moved += 1
            except (ProcessLookupError, PermissionError, OSError):  # exited, or not ours
                continue
    log.info("core fence: %d threads of the Ray node moved to cores %s", moved, sorted(other))
    return moved
