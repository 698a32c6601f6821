"""Timeline plot of a replay: traffic, forecast, hot and cold replicas, queue (matplotlib, Agg)."""

from __future__ import annotations

import numpy as np


def _per_minute(x: np.ndarray, how=np.mean) -> np.ndarray:
    n = len(x) // 60 * 60
    return how(x[:n].reshape(-1, 60), axis=1)


def plot_timeline(report: dict, results: dict, prep, path: str, focus: str = "tideserve") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = np.arange(len(prep.arrivals) // 60) / 60.0 + prep.t0_s / 3600.0
    cap = report["replica_capacity_rps"]
    fig, axes = plt.subplots(3, 1, figsize=(14, 9), sharex=True)
    ax = axes[0]
    ax.plot(hours, _per_minute(prep.arrivals), lw=0.6, color="k", label="arrivals (req/s)")
    main = results.get(focus) or next(iter(results.values()))
    if not np.isnan(main.forecast_rps).all():
        ticks = len(main.forecast_rps)
        t_fc = prep.t0_s / 3600.0 + np.arange(ticks) * report["interval_s"] / 3600.0
        ax.plot(t_fc, main.forecast_rps, lw=0.6, color="tab:orange", label=f"{main.name} plan")
    ax.set_ylabel("req/s")
    ax.legend(loc="upper left")
    ax = axes[1]
    for name, res in results.items():
        style = dict(lw=1.2) if name == main.name else dict(lw=0.6, alpha=0.7)
        ax.plot(hours, _per_minute(res.replicas), label=name, **style)
    ax.plot(hours, _per_minute(prep.arrivals) / cap, lw=0.5, color="k", ls=":", label="load/cap")
    hot = next(r["hot_replicas"] for r in report["policies"] if r["name"] == main.name)
    ax.axhline(hot, color="tab:blue", ls="--", lw=0.8, label=f"{main.name} hot pool")
    ax.set_ylabel("replicas (GPU-holding)")
    ax.legend(loc="upper left", ncol=4, fontsize=7)
    ax = axes[2]
    for name, res in results.items():
        ax.plot(hours, _per_minute(res.queue, np.max), lw=0.6, label=name)
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylabel("queue (max/min)")
    ax.set_xlabel("hours since trace start")
    ax.legend(loc="upper left", ncol=4, fontsize=7)
    title = (
        f"{report['trace']}: judged {report['judged_span_s'] / 86400:.1f} days after "
        f"{report['train_days']} training days, cold start {report['cold_start_s']:.0f} s"
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
