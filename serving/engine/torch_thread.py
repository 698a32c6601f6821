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

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
