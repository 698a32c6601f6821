"""Where a served model's CPU time goes when the front door shares its cores (Linux /proc).

Two readings, both of the local Ray cluster a benchmark started:
- the idle background: CPU cores each process role burns with the application up and no traffic
  (Ray's controller, GCS, dashboard, log monitor, our ingress's pool poll...). On a machine with
  `cores` CPUs, a model whose engine alone keeps every core busy can reach at most
  (cores - background) / cores of its engine-alone speed once served: that is a ceiling before
  any request's own cost.
- the model thread's contention: /proc/<pid>/task/<tid>/schedstat gives each thread's time on a
  CPU and its time runnable but waiting for one (the run queue). The replica's busiest thread is
  its torch thread (serving/engine/torch_thread.py); a large wait share means it was ready to
  compute and another process held the core.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from benchmarks._common import cpu_snapshot, cpu_used, process_role


@dataclass(frozen=True)
class ThreadTimes:
    pid: int
    tid: int
    name: str
    run_s: float  # on a CPU
    wait_s: float  # runnable, waiting on the run queue
    slices: int  # times it was put on a CPU
    cores: tuple[int, ...] = ()  # where it may run (its affinity) when read


def thread_times(pids: list[int]) -> dict[tuple[int, int], ThreadTimes]:
    """Every thread of `pids`, keyed (pid, tid); threads that exit meanwhile are skipped."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/comm") as f:
                    name = f.read().strip()
                with open(f"{base}/schedstat") as f:
                    run_ns, wait_ns, slices = (int(x) for x in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
            try:
                cores = tuple(sorted(os.sched_getaffinity(int(tid))))
            except OSError:
                cores = ()
            key = (pid, int(tid))
            out[key] = ThreadTimes(pid, int(tid), name, run_ns / 1e9, wait_ns / 1e9, slices, cores)
    return out


def busiest_threads(before: dict, after: dict, num: int = 1) -> list[dict]:
    """The `num` threads that ran longest between two `thread_times` readings, longest first:
    run and run-queue wait seconds, the share of busy time spent waiting, and the cores the
    thread may run on."""
    deltas = []
    for key, b in after.items():
        a = before.get(key)
        if a is not None:
            deltas.append((b.run_s - a.run_s, b.wait_s - a.wait_s, b.slices - a.slices, b))
    deltas.sort(key=lambda d: d[0], reverse=True)
    return [
        {
            "thread": t.name,
            "tid": t.tid,
            "cores": list(t.cores),
            "run_s": round(run_s, 2),
            "runqueue_wait_s": round(wait_s, 2),
            "wait_share": round(wait_s / max(run_s + wait_s, 1e-9), 3),
            "num_slices": slices,
        }
        for run_s, wait_s, slices, t in deltas[:num]
    ]


def busiest_thread(before: dict, after: dict) -> dict | None:
    """The thread that ran longest between two readings (busiest_threads), or None."""
    top = busiest_threads(before, after)
    return top[0] if top else None


def idle_background(duration_s: float) -> dict:
    """CPU cores per process role of this process's descendants over `duration_s` of no traffic
    (call it with nothing in flight), and their sum."""
    before = cpu_snapshot()
    time.sleep(duration_s)
    used, _ = cpu_used(before, cpu_snapshot())
    used.pop("client", None)  # this benchmark itself, asleep
    cores = {role: round(s / duration_s, 3) for role, s in used.items()}
    return {"duration_s": duration_s, "cores": round(sum(cores.values()), 3), "by_role": cores}


def pids_of_role(role: str) -> list[int]:
    """Descendants of this process whose Ray role (benchmarks/_common.process_role) is `role`."""
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if process_role(proc.cmdline(), False) == role:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out
