"""`format_plan`: a capacity plan as the aligned text table `python -m capacity plan` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capacity.planner import Plan


def format_plan(p: Plan) -> str:
    """Human-readable budget table, throughput and replicas (aligned columns)."""
    i = p.inputs
    lines = [
        f"Capacity plan: {i.spec.name}, {i.dtype}, avg {i.avg_input_tokens} in + "
        f"{i.avg_output_tokens} out tokens, max_model_len {i.max_model_len}, "
        f"peak {i.peak_qps:g} QPS",
        "",
        "Memory budget (R4)",
    ]
    rows = p.budget_rows()
    width = max(len(k) for k, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    lines += [f"  {k:<{width}}  {v:>{vwidth}}" for k, v in rows]
    eff = i.utilization if i.effective_utilization is None else i.effective_utilization
    bound = p.decode_bound
    thr = [
        ("decode step @ max concurrency", f"{p.decode_step_s * 1e3:.2f} ms ({bound}-bound)"),
        ("prefill per request", f"{p.prefill_s_per_request * 1e3:.2f} ms"),
        ("roofline requests/s per replica", f"{p.raw_requests_per_s:.2f}"),
        (
            f"planned requests/s (x {eff:g} util x {i.safety:g} safety)",
            f"{p.replica_requests_per_s:.2f}",
        ),
        ("planned output tokens/s per replica", f"{p.replica_tokens_per_s:,.0f}"),
    ]
    rep = [
        ("replicas at peak", f"{p.replicas_at_peak}"),
        (f"hot pool ({i.hot_fraction:.0%})", f"{p.hot_replicas}"),
        ("cold pool max", f"{p.cold_max_replicas}"),
    ]
    width = max(len(k) for k, _ in thr + rep)
    lines += ["", "Throughput (roofline, R6)"]
    lines += [f"  {k:<{width}}  {v}" for k, v in thr]
    lines += ["", "Replicas (R5/R6)"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rep]
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)
