"""`tideserve doctor`: R10's triage of a running LLM app as one verdict (pure; readings passed in).

The checks, in R10's order ("config consistency first, then capacity; memory watermark and queue
time first, then compute efficiency"); the first that fails is the verdict:

    config   hot and cold run one configuration (their fingerprints match; else the keys differ)
    memory   the concurrency cap x the average request against the KV budget: above 1 the cap
             promises what KV cannot hold (the OOM early warning), failing once requests queue on
             KV; KV use past the 85% watermark
    adapters LoRA slot thrashing (loads per adapter request high, slots full) while first
             tokens are slow: raise engine.max_loras (serving/llm/doctor_adapters.py)
    queue    admission wait p99 past half the tier's TTFT SLO, a waiting line that grows while
             arrivals outpace completions, or refusals at admission. If a limit binds and
             raising it pays (KV room, steps with room, the step-cost line says a bigger batch
             adds throughput), that knob; otherwise the arrivals exceed what the replicas
             serve: add replicas
    compute  inter-token p99 past its SLO: the steps are too long (batch too big)

Each verdict names one knob and by how much. Readings come from `ModelReplica.reading()`
(serving/llm/replica.py, built by serving/llm/monitor.py); `serving/llm/doctor_cli.py` collects
them and prints this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from serving.llm.doctor_adapters import check_adapters
from serving.llm.doctor_checks import (
    Finding,
    check_compute,
    check_config,
    check_memory,
    check_queue,
)
from serving.llm.messages import ReplicaReading

ORDER = ("config", "memory", "adapters", "queue", "compute")


@dataclass(frozen=True, slots=True)
class Verdict:
    cause: str  # the failing finding's cause, "healthy", or "no_replicas"
    summary: str
    knob: str | None
    change: str | None
    findings: tuple[Finding, ...]
    num_replicas: Mapping[str, int]

    def to_dict(self) -> dict:
        return {
            "cause": self.cause,
            "summary": self.summary,
            "knob": self.knob,
            "change": self.change,
            "num_replicas": dict(self.num_replicas),
            "findings": [asdict(f) for f in self.findings],
        }


def diagnose(readings: Sequence[ReplicaReading]) -> Verdict:
    """The R10 triage of these replicas' readings (see the module table)."""
    pools: dict[str, int] = {}
    for r in readings:
        pools[r.pool] = pools.get(r.pool, 0) + 1
    if not readings:
        return Verdict("no_replicas", "no running replica answered", None, None, (), pools)
    findings = (
        check_config(readings),
        check_memory(readings),
        check_adapters(readings),
        check_queue(readings),
        check_compute(readings),
    )
    for status in ("fail", "warn"):
        for f in findings:
            if f.status == status:
                return Verdict(f.cause, f.summary, f.knob, f.change, findings, pools)
    return Verdict("healthy", "every check passed", None, None, findings, pools)


def format_verdict(v: Verdict, app: str = "tideserve") -> str:
    pools = ", ".join(f"{p} {n}" for p, n in sorted(v.num_replicas.items())) or "none"
    lines = [f"tideserve doctor: app {app!r}, replicas: {pools}", f"verdict: {v.summary}"]
    if v.knob:
        lines.append(f"  turn: {v.knob}  {v.change}")
    lines.append("triage (R10: config, memory, adapters, queue, compute):")
    for f in v.findings:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}[f.status]
        lines.append(f"  [{mark}] {f.check:<8} {f.summary}")
        lines += [f"           - {e}" for e in f.evidence]
    return "\n".join(lines)
