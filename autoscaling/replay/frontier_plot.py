"""Plot of the frontier: SLO attainment against GPU-hours per policy, one panel per trace."""

from __future__ import annotations

from autoscaling.replay.cold_starts import ColdStarts

COLOURS = {
    "reactive": "tab:red",
    "knative": "tab:purple",
    "rule_70_30": "tab:green",
    "tideserve": "tab:blue",
    "present_rate": "tab:grey",
    "next_window": "tab:olive",
    "oracle": "black",
    "rate_oracle": "tab:brown",
}

LABELS = {
    "present_rate": "present_rate (reference: true rate x fixed headroom)",
    "next_window": "next_window (reference: told the next window a cold start ahead)",
    "rate_oracle": "rate_oracle (reference: knows the rate curve ahead, not the arrivals)",
}
DASHES = {"present_rate": "--", "next_window": ":", "rate_oracle": "-."}  # hindsight yardsticks


def _violation_share(row: dict) -> float:
    # plotted as the share of requests outside the SLO, on a log axis, so 99.5% and 99.9% part
    return max(1.0 - row["slo_attainment"], 1e-6)


def plot_frontier(reports: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(reports), figsize=(7 * len(reports), 5.5), squeeze=False)
    for ax, rep in zip(axes[0], reports, strict=True):
        oracle = rep["oracle_gpu_hours"]
        least = min(r["gpu_hours"] for rows in rep["sweeps"].values() for r in rows) / oracle
        for policy, rows in rep["sweeps"].items():
            rows = sorted(rows, key=lambda r: r["gpu_hours"])
            xs = [r["gpu_hours"] / oracle for r in rows]
            ys = [_violation_share(r) for r in rows]
            style = dict(
                marker="o", ms=4, color=COLOURS.get(policy), label=LABELS.get(policy, policy)
            )
            if policy in DASHES:
                style["ls"] = DASHES[policy]
            ax.plot(xs, ys, lw=2.0 if policy == "tideserve" else 1.0, **style)
            for r, x, y in zip(rows, xs, ys, strict=True):
                if "default" in r["label"] or "R6" in r["label"] or r.get("is_default"):
                    ax.annotate(r["label"], (x, y), fontsize=7, xytext=(4, 4),
                                textcoords="offset points")  # fmt: skip
        for slo, ls in ((0.995, "--"), (0.999, ":")):
            ax.axhline(1 - slo, color="grey", ls=ls, lw=0.8, label=f"{100 * slo:g}% in SLO")
        ax.axvline(1.15, color="grey", ls="-.", lw=0.8, label="1.15x oracle")
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_xlim(min(0.9, 0.95 * least), 6.0)  # behind admission, lean points pass the oracle
        ax.set_xlabel("GPU-hours / oracle's")
        ax.set_ylabel("share of requests over the TTFT SLO")
        queue = rep.get("service_queue", "FIFO queue")
        ax.set_title(
            f"{rep['trace']} (judged {rep['judged_days']:.0f} d, {_cold_start(rep)}, {queue})",
            fontsize=10,
        )
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cold_start(rep: dict) -> str:
    starts = rep.get("cold_starts")
    if starts is None or ColdStarts(tuple(starts["samples_s"])).is_constant:
        return f"cold start {rep.get('cold_start_s', 120.0):.0f} s"
    # on a line of its own: beside the trace's name it runs into the next panel's title
    return f"\nmeasured cold starts: median {starts['median_s']:.0f} s, p95 {starts['p95_s']:.0f} s"
