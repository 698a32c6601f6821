"""`tideserve doctor`'s adapter check: LoRA slot thrashing as a cause of slow first tokens.

A replica has engine.max_loras slots. When the adapters its requests use do not fit, every other
request finds its adapter evicted: it waits for a load (weights copied into a slot), or for a
slot to free when every slot is pinned by running requests of other adapters (admission stops on
'adapter'). Both show as TTFT. Judged over the last closed step window:

    thrashing   loads per adapter request >= THRASH_LOADS with evictions (the slots are full and
                cycling, not filling for the first time), or admission stopped on a pinned slot
                pool in >= BOUND_SHARE of the steps
    slow        TTFT p99 past QUEUE_SHARE of its tier's SLO (R10's half of the latency budget)

thrashing and slow: fail (raise engine.max_loras); thrashing alone: warn.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.llm.doctor_checks import BOUND_SHARE, QUEUE_SHARE, Finding, worst_ratio
from serving.llm.messages import ReplicaReading

THRASH_LOADS = 0.25  # a quarter of adapter requests loading their adapter
MAX_LORAS = 256  # EngineConfig's ceiling


def _evidence(r: ReplicaReading) -> str:
    w, bound = r.lora_window, r.window.adapter_bound if r.window is not None else 0.0
    return (
        f"{r.pool}: {w.admissions} adapter requests, {w.loads} loads "
        f"({w.loads_per_admission:.2f} per request), {w.evictions} evictions on "
        f"{r.lora_slots_total} slots; admission waited for a slot in {bound:.0%} of steps"
    )


def _thrashing(r: ReplicaReading) -> bool:
    w = r.lora_window
    cycling = w.evictions > 0 and w.loads_per_admission >= THRASH_LOADS
    return cycling or (r.window is not None and r.window.adapter_bound >= BOUND_SHARE)


def check_adapters(readings: Sequence[ReplicaReading]) -> Finding:
    served = [r for r in readings if r.lora_slots_total]
    if not served:
        return Finding("adapters", "ok", "no_adapters", "no LoRA slots (engine.max_loras is 0)")
    used = [r for r in served if r.lora_window.admissions and r.window is not None]
    if not used:
        return Finding("adapters", "ok", "no_adapter_traffic", "no adapter requests last window")
    evidence = tuple(_evidence(r) for r in used)
    thrash = [r for r in used if _thrashing(r)]
    if not thrash:
        summary = "adapters stay in their slots"
        return Finding("adapters", "ok", "adapters_ok", summary, None, None, evidence)
    r = max(thrash, key=lambda x: x.lora_window.loads_per_admission)
    ratio = worst_ratio(r, r.window.ttft_p99_s, "ttft_p99_s")
    slots = r.lora_slots_total
    evidence += (
        f"{r.pool}: TTFT p99 {ratio:.2f}x its SLO (slow past {QUEUE_SHARE}x)",
        "or add replicas: the router homes each adapter on one replica, so each holds fewer",
    )
    summary = (
        f"adapter thrashing: {r.lora_window.loads_per_admission:.0%} of LoRA requests on "
        f"{r.pool} load their adapter into one of {slots} full slots"
    )
    if ratio <= QUEUE_SHARE:
        return Finding("adapters", "warn", "adapter_thrashing", summary, None, None, evidence)
    summary += "; first tokens wait for the loads"
    change = f"{slots} -> {min(MAX_LORAS, 2 * slots)}"
    return Finding(
        "adapters", "fail", "adapter_thrashing", summary, "engine.max_loras", change, evidence
    )
