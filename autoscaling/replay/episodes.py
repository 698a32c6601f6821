"""Where a policy's SLO violations come from: episodes, and the rate steps that start them.

An episode is a run of consecutive seconds whose TTFT misses the SLO or that refuse requests
(429, with a service model that admits). A trace given as
10-minute means (ServeGen) changes rate at window edges, so most of a replay's violations
follow a step up that no forecast saw coming: once the capacity held at the edge is short,
no replica can help before one tick plus one cold start (`reaction_floor_s`). An episode that
lasts about that long is one the policy answered as fast as any policy without foresight
could; it could only have been avoided by holding capacity for the step beforehand.

`episodes` lists them; `summarise` says what share of the violations follow a step up of at
least `step_ratio` within the reaction floor of a window edge, and how long those episodes
last. Pure numpy, no clock.
"""

from __future__ import annotations

import numpy as np


def episodes(bad: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of True in `bad`."""
    edges = np.flatnonzero(np.diff(np.r_[0, bad.astype(np.int8), 0]))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def step_ratio_at(arrivals: np.ndarray, second: int, bin_s: int) -> float:
    """The window's mean rate over the previous window's at the window edge before `second`
    (nan for the first window or an empty previous one)."""
    edge = (second // bin_s) * bin_s
    if edge < bin_s:
        return float("nan")
    prev = float(arrivals[edge - bin_s : edge].mean())
    now = float(arrivals[edge : edge + bin_s].mean())
    return now / prev if prev > 0 else float("nan")


def summarise(
    ttft_s: np.ndarray,
    arrivals: np.ndarray,
    scored: np.ndarray,
    slo_s: float,
    bin_s: int,
    reaction_floor_s: float,
    step_ratio: float = 1.25,
    refused: np.ndarray | None = None,
) -> dict:
    """Violation episodes of one simulated policy, split by whether a step up started them.
    `refused`: requests refused per second (violations too; their TTFT is not in ttft_s)."""
    refused = np.zeros(len(arrivals)) if refused is None else refused
    weight = np.where(scored, np.where(ttft_s > slo_s, arrivals, refused), 0.0)
    bad = weight > 0
    rows = []
    for lo, hi in episodes(bad):
        near_edge = lo % bin_s <= reaction_floor_s
        after_step = near_edge and step_ratio_at(arrivals, lo, bin_s) >= step_ratio
        rows.append((float(weight[lo:hi].sum()), hi - lo, after_step))
    total = sum(v for v, _, _ in rows)
    stepped = [(v, d) for v, d, s in rows if s]
    stepped_total = sum(v for v, _ in stepped)
    return {
        "num_episodes": len(rows),
        "step_up_min_ratio": step_ratio,
        "num_after_step_up": len(stepped),
        "violations_after_step_up_share": stepped_total / total if total else 0.0,
        # the episode a violating request sat in, typically: most episodes are a few seconds
        # of a small shortfall, most violations are in the few long ones
        "duration_s_after_step_up_by_violation": sum(v * d for v, d in stepped) / stepped_total
        if stepped_total
        else None,
        "reaction_floor_s": reaction_floor_s,
    }
