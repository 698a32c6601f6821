"""One seed's frontier summarised (benchmarks/autoscaling_frontier.py): the GPU-hours each policy
needs to reach 99.5% and 99.9%, tideserve's default point, reactive and the present-rate
reference at its GPU-hours, and where the violations come from."""

from __future__ import annotations

from autoscaling.replay.frontier import gpu_hours_to_reach, violations_at

SLOS = (0.995, 0.999)


def _nearest(rows: list[dict], gpu_hours: float) -> dict:
    """The sweep point closest in GPU-hours: its knob value, GPU-hours and violation episodes."""
    r = min(rows, key=lambda r: abs(r["gpu_hours"] - gpu_hours))
    return {"value": r["value"], "gpu_hours": r["gpu_hours"], **r["episodes"]}


def _present_rate_context(sweeps: dict[str, list[dict]], ts: dict, re_viol: float | None) -> dict:
    """What perfect knowledge of the present buys, at tideserve's default GPU-hours: the
    reference's violations there, and reactive's over them (T3's ratio, for the reference).
    Per swept headroom: reactive's violations over the reference's at the same GPU-hours (None
    where reactive's sweep does not span them, or where the reference had no violation)."""
    rows = sweeps.get("present_rate", [])
    by_headroom = {}
    for r in rows:
        v = violations_at(sweeps["reactive"], r["gpu_hours"])
        ok = v is not None and r["num_slo_violations"] > 0
        by_headroom[f"{r['value']:g}"] = v / r["num_slo_violations"] if ok else None
    at_ts = violations_at(rows, ts["gpu_hours"]) if rows else None
    return {
        "violations_at_tideserve_gpu_hours": at_ts,
        "reactive_violations_over_its_own_at_tideserve_gpu_hours": None
        if at_ts is None or re_viol is None
        else re_viol / max(at_ts, 0.5),
        "tideserve_violations_over_its_own_at_tideserve_gpu_hours": None
        if at_ts is None
        else ts["num_slo_violations"] / max(at_ts, 0.5),
        "reactive_violations_over_its_own_by_fixed_headroom": by_headroom,
    }


def summarise(sweeps: dict[str, list[dict]], default_q: float) -> dict:
    oracle = sweeps["oracle"][0]["gpu_hours"]
    reach = {
        p: {f"{100 * slo:g}%": gpu_hours_to_reach(rows, slo) for slo in SLOS}
        for p, rows in sweeps.items()
    }
    ts = next(r for r in sweeps["tideserve"] if r["value"] == default_q)
    ts["is_default"] = True
    re_viol = violations_at(sweeps["reactive"], ts["gpu_hours"])
    return {
        "oracle_gpu_hours": oracle,
        "gpu_hours_to_reach": reach,
        "gpu_hours_to_reach_over_oracle": {
            p: {k: (v / oracle if v is not None else None) for k, v in d.items()}
            for p, d in reach.items()
        },
        "tideserve_default": {
            k: ts[k] for k in ("value", "gpu_hours", "slo_attainment", "num_slo_violations")
        }
        | {"gpu_hours_over_oracle": ts["gpu_hours"] / oracle},
        "reactive_violations_at_tideserve_gpu_hours": re_viol,
        "present_rate_reference": _present_rate_context(sweeps, ts, re_viol),
        "violation_episodes": {
            "tideserve_default": ts["episodes"],
            "reactive_nearest_gpu_hours": _nearest(sweeps["reactive"], ts["gpu_hours"]),
        },
        # the earlier T3's ratio (violating requests, reactive over tideserve), for comparison
        "reactive_violations_over_tideserve_at_equal_gpu_hours": None
        if re_viol is None
        else re_viol / max(ts["num_slo_violations"], 0.5),
    }
