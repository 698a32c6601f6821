"""`plot_plan`: a capacity plan as a PNG (`python -m capacity plan ... --plot PATH`).

Two panels: the device-memory split as one stacked bar (weights / reserve / KV region / free, GiB)
and max concurrency against sequence length (log-x), from the plan's KV block count through
`capacity.memory.max_concurrency`, the same formula the planner and the engine use.

matplotlib is imported lazily (Agg backend, no display needed) so the planner itself never needs it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from capacity import memory

if TYPE_CHECKING:
    from capacity.planner import Plan, PlanInputs

_GIB = 1024**3
_MIN_SEQ = 128


def concurrency_curve(
    num_blocks: int,
    block_size_tokens: int,
    max_model_len: int,
    points: int = 200,
    group_windows: tuple[int | None, ...] = (None,),
) -> tuple[list[int], list[int]]:
    """(sequence lengths, max concurrency at each) from 128 (or less) up to max_model_len.

    Lengths are log-spaced (both ends included); the curve is a staircase, drawn with
    `where="post"`, so `points` samples are enough to show its shape. Sliding-window groups
    hold at most their window (capacity.memory.seq_blocks), so the curve flattens past it.
    """
    lo = min(_MIN_SEQ, max_model_len)
    hi = max_model_len
    if hi == lo:
        lengths = [lo]
    else:
        ratio = (hi / lo) ** (1 / (points - 1))
        lengths = sorted({min(hi, max(lo, round(lo * ratio**k))) for k in range(points)} | {hi})
    conc = [
        memory.max_concurrency(num_blocks, n, block_size_tokens, group_windows) for n in lengths
    ]
    return lengths, conc


def _memory_bar(ax, plan: Plan) -> None:
    """The device-memory split as one stacked bar, GiB."""
    i, s = plan.inputs, plan.split
    used = s.weight_bytes + s.reserve_bytes + s.kv_region_bytes
    parts = [
        ("weights", s.weight_bytes, "#4c72b0"),
        ("reserve", s.reserve_bytes, "#dd8452"),
        ("KV region", s.kv_region_bytes, "#55a868"),
        ("free", max(0, s.device_bytes - used), "#c8c8c8"),
    ]
    bottom = 0.0
    for label, nbytes, color in parts:
        gib = nbytes / _GIB
        text = f"{label} {gib:.1f} GiB"
        ax.bar([0], [gib], bottom=bottom, color=color, width=0.6, label=text)
        if gib > 0.04 * s.device_bytes / _GIB:
            ax.text(0, bottom + gib / 2, f"{label}\n{gib:.1f} GiB", ha="center", va="center")
        bottom += gib
    ax.set_xticks([0], [i.spec.name])
    ax.set_xlim(-0.6, 0.6)
    ax.set_ylim(0, s.device_bytes / _GIB * 1.02)
    ax.set_ylabel("GiB")
    ax.set_title(f"Memory split ({plan.memory_watermark:.0%} used, {i.dtype})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8, ncol=2)


def _concurrency_panel(ax, plan: Plan) -> None:
    """Max concurrency against sequence length (log-x), the average and max lengths marked."""
    i, s = plan.inputs, plan.split
    lengths, conc = concurrency_curve(
        s.num_blocks, s.block_size_tokens, i.max_model_len, group_windows=plan.group_windows
    )
    ax.step(lengths, conc, where="post", color="#4c72b0", label="max concurrency")
    ax.set_xscale("log")
    ax.set_xlabel("sequence length (tokens, prompt + completion)")
    ax.set_ylabel("sequences that fit in the KV region")
    ax.set_title(
        f"Max concurrency: {s.num_blocks:,} blocks x {s.block_size_tokens} tokens "
        f"({s.kv_region_bytes / _GIB:.1f} GiB)"
    )
    avg_len = i.avg_input_tokens + i.avg_output_tokens
    marks = [
        (avg_len, plan.max_concurrency_avg, f"avg {avg_len} tok: {plan.max_concurrency_avg}", "g"),
        (
            i.max_model_len,
            plan.max_concurrency_max_len,
            f"max_model_len {i.max_model_len}: {plan.max_concurrency_max_len}",
            "r",
        ),
    ]
    for x, y, label, color in marks:
        ax.axvline(x, color=color, linestyle="--", linewidth=1)
        ax.plot([x], [y], "o", color=color, label=label)
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot_plan(plan_inputs: PlanInputs, plan: Plan, path: str | os.PathLike) -> str:
    """Write the plan's memory split and concurrency curve to a PNG at `path`; returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    i = plan_inputs
    fig = Figure(figsize=(11, 4.5), dpi=110)
    ax_mem, ax_conc = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2.2]})
    _memory_bar(ax_mem, plan)
    _concurrency_panel(ax_conc, plan)
    fig.suptitle(
        f"{plan.num_params / 1e9:.2f} B params on {i.spec.name}: {plan.replicas_at_peak} replicas "
        f"at {i.peak_qps:g} QPS ({plan.hot_replicas} hot + {plan.cold_max_replicas} cold max)"
    )
    fig.tight_layout()
    out = os.fspath(path)
    fig.savefig(out, format="png")
    return out
