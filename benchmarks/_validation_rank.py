"""The validation protocol's rule (docs/autoscaling.md): candidates' summaries from
benchmarks/autoscaling_validation_frontier.py, best first."""

from __future__ import annotations

import math

from autoscaling.replay import judge


def rank(summary: dict[str, dict]) -> list[str]:
    """The protocol's rule over candidates' summaries, best first: the share of replays meeting
    T1, then T3a's 95% interval above 0 on these days (none computed counts as not above), then
    the replays cheaper than Knative to 99.5%, then cost (`_by_cost_then_t3a`)."""

    def key(name: str) -> tuple:
        s = summary[name]
        return (-s["t1_share"], _t3a_lo(s) <= 0, -s["num_beating_knative"])

    ranked: list[str] = []
    for k in sorted({key(n) for n in summary}):
        ranked += _by_cost_then_t3a([n for n in summary if key(n) == k], summary)
    return ranked


def _t3a_lo(s: dict) -> float:
    ci = s["violation_minutes_fewer_than_knative_per_day"]
    return -math.inf if ci is None else ci["lo"]


def _by_cost_then_t3a(names: list[str], summary: dict[str, dict]) -> list[str]:
    """Cheapest mean cost to 99.5% first, except that the candidates whose cost is not shown
    to be higher than the cheapest's (the paired per-replay difference's 95% interval reaches
    0) are tied with it, and ties go to the larger lower bound of T3a's interval: a cost
    difference within the seeds' noise does not outrank a margin on the unmet target. Set
    before the eleventh tuning run (docs/autoscaling.md), after the tenth's gains tied."""
    if not names:
        return []
    names = sorted(names, key=lambda n: summary[n]["mean_to_99_5_over_oracle"])
    cheapest = summary[names[0]]
    tied = [n for n in names if n == names[0] or _cost_tied(summary[n], cheapest)]
    tied.sort(key=lambda n: -_t3a_lo(summary[n]))
    return tied + _by_cost_then_t3a([n for n in names if n not in tied], summary)


def _cost_tied(s: dict, cheapest: dict) -> bool:
    """Whether s's cost to 99.5% is within the noise of the cheapest candidate's: the 95%
    interval of the difference, paired by split and seed over the replays both reached 99.5%
    on, reaches 0. Fewer than two such replays: not tied."""
    theirs = {(sp, seed): c for sp, seed, c in cheapest["to_99_5_by_replay"] if c is not None}
    diffs = [
        c - theirs[(sp, seed)]
        for sp, seed, c in s["to_99_5_by_replay"]
        if c is not None and (sp, seed) in theirs
    ]
    return len(diffs) >= 2 and judge.mean_ci95(diffs)["lo"] <= 0
