"""A compressed day with live interactive traffic and a batch (benchmarks/batch_valleys.py's
measurement, sized for CI on 2 shared cores: a 30 s day and 80 batch requests; the issue's 500
requests run in the benchmark's full mode).

Checked: the batch finishes inside its window with every request answered once, the hot
replica's utilisation in the valleys rises, and interactive TTFT p99 with the batch stays within
1.5x of the days without it plus `NOISE_S` (the 1.1x target is reported by the benchmark). On a
shared 2-core machine the days without the batch alone differ by up to 1.3x, and their p99 is
60-80 ms, so one scheduling hiccup doubles the ratio: a CI run saw 166 ms against 82 ms. A lane
that ignored its slot share would add hundreds of milliseconds, which the bound still catches.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

NOISE_S = 0.15  # absolute slack on the p99 bound: tens of ms of p99 is noise on 2 shared cores


def test_a_batch_fills_the_valleys_of_a_compressed_day(ray_cluster):
    from benchmarks._batch_day import Day
    from benchmarks.batch_valleys import measure, summary

    day = Day(day_s=30.0, valley_rps=1.0, peak_rps=6.0)
    runs = measure(day, lines=80, capacity_rps=8.0, slot_share=0.25, repeats=1)
    result = summary(runs["baseline_days"], runs["batch_days"])
    (with_batch,) = runs["batch_days"]
    batch = with_batch["batch"]
    brief = {k: v for k, v in batch.items() if k != "estimates"}
    print(json.dumps({"summary": result, "batch": brief}, indent=2))
    assert batch["status"] == "completed" and batch["inside_window"], batch
    assert result["batch_answered_once"], batch
    assert batch["request_counts"] == {"total": 80, "completed": 80, "failed": 0}
    assert result["valley_utilisation_rises"], result["utilisation"]
    assert with_batch["interactive"]["all"]["num_ok"] == len(day.arrivals())
    without_s, with_s = result["ttft_p99_pooled_without_s"], result["ttft_p99_pooled_with_s"]
    assert with_s <= 1.5 * without_s + NOISE_S, result
    # the completion estimate came from the lane's forecast, not from the pace
    shown = [e for e in batch["estimates"] if e["estimated_completion_in_s"] is not None]
    assert shown and all("forecast valleys" in e["basis"] for e in shown), batch["estimates"]
