"""A compressed day with live interactive traffic and a batch (benchmarks/batch_valleys.py's
measurement, sized for CI on 2 shared cores: a 30 s day and 80 batch requests; the issue's 500
requests run in the benchmark's full mode).

Checked: the batch finishes inside its window with every request answered once, the hot
replica's utilisation in the valleys rises, and interactive TTFT p99 with the batch stays within
1.5x of the days without it (the 1.1x target is reported by the benchmark; on a shared 2-core
machine run-to-run noise alone moves p99 by ~25%, so CI asserts a looser bound).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


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
    assert result["ttft_p99_ratio"] <= 1.5, result
    # the completion estimate came from the lane's forecast, not from the pace
    shown = [e for e in batch["estimates"] if e["estimated_completion_in_s"] is not None]
    assert shown and all("forecast valleys" in e["basis"] for e in shown), batch["estimates"]
