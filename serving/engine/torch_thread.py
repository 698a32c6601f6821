"""One thread per process for the engine's torch work: loading, warm-up and every step.

Why: PyTorch's CPU build runs its parallel regions on GNU OpenMP, which gives each thread that
starts one a team of its own. Once the process holds more OpenMP threads than CPUs (a team made
while the model loaded on the caller's thread, another where the steps run), libgomp throttles
every team's spin-wait to about a thousand spins, so each of the ~1500 parallel regions of a
decode step waits for a futex wake-up instead. On this project's 2-vCPU VM (SmolLM2-135M, 16
sequences, bfloat16) a decode step took 73 ms with the load and the steps on one thread and
151-160 ms with the load on the main thread and the steps on a worker: the async path a
replica serves through (steps in an executor thread) ran at half the engine's speed.

So the engine hops here for its construction and for each step (`call`), and the async driver
uses this thread as its executor. A call made on this thread runs inline. One thread serves
every engine of the process, one step at a time, as the engine is not thread-safe anyway.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_ident: int | None = None


def executor() -> ThreadPoolExecutor:
    """The process's torch thread (started on first use)."""
    global _executor, _ident
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tideserve-torch")
            _ident = _executor.submit(threading.get_ident).result()
        return _executor


def on_torch_thread() -> bool:
    return _ident is not None and threading.get_ident() == _ident


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on the torch thread, waiting for its result (inline when already
    there); its exception is raised here."""
    if on_torch_thread():
        return fn(*args, **kwargs)
    return executor().submit(fn, *args, **kwargs).result()


# ----- the replica's core layout (decision 10, docs/engine.md#cores-decision-10) -----------------
AUTO = "auto"
# Cores an `auto` layout leaves to the front door (HTTP proxy, ingress), Ray's own processes and
# the replica's event loop when the replica holds its node: what vLLM's CPU build reserves
# (reserve_cpu_num=1). An OpenMP team that shares its cores with busy processes waits at every
# barrier for the descheduled member, so a core kept free costs less than it seems.
RESERVED_CORES = 1


@dataclass(frozen=True, slots=True)
class CoreLayout:
    """How many torch threads a replica runs and, when it holds its node, on which cores."""

    threads: int
    model_cores: tuple[int, ...] | None = None  # None: not pinned (the OS places the threads)
    other_cores: tuple[int, ...] | None = None  # the process's other threads (event loop, Ray)

    @property
    def pinned(self) -> bool:
        return self.model_cores is not None


def core_layout(torch_threads: int | str, num_cpus: float, node_cores: Sequence[int]) -> CoreLayout:
    """The layout of one replica on a node whose usable cores are `node_cores`.

    An integer is taken as it is, unpinned (the layout before `auto`). `auto`: where the replica
    reserves the whole node from Ray (num_cpus >= its cores) no other replica can share them, so
    the model gets all but RESERVED_CORES of them, pinned, and the rest of the process goes to the
    reserved ones. Where Ray may place other replicas beside it, Ray does not say which cores are
    whose, so pinning could stack two replicas on one core: floor(num_cpus) threads (>= 1),
    unpinned."""
    if torch_threads != AUTO:
        return CoreLayout(threads=int(torch_threads))
    cores = tuple(sorted(node_cores))
    if len(cores) < 2 or num_cpus < len(cores):
        return CoreLayout(threads=max(1, min(len(cores), math.floor(num_cpus))))
    n = len(cores) - RESERVED_CORES
    return CoreLayout(threads=n, model_cores=cores[:n], other_cores=cores[n:])


def node_cores() -> tuple[int, ...]:
    """The cores this process may run on (its cgroup's cpuset, not the host's count)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def apply_layout(layout: CoreLayout) -> None:
    """Set the torch threads and, for a pinned layout, bind the torch thread (and so the OpenMP
    team it starts, which inherits its mask) to the model cores and every other thread of the
    process to the rest; threads started later by those inherit their masks too."""
    import torch

    torch.set_num_threads(layout.threads)  # this thread, and the default for new ones
    call(torch.set_num_threads, layout.threads)  # the torch thread may have read it already
    if not layout.pinned:
        return
    model_tid = call(threading.get_native_id)
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        cores = layout.model_cores if tid == model_tid else layout.other_cores
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):  # a thread that exited meanwhile
            continue
