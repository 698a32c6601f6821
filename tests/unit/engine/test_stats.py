"""The engine's queue-wait statistics (serving/engine/stats.py) are recent: they feed the
autoscaler's emergency test, so a slow admission long ago, or the replica's own start-up
self-check, must not read as a queue once traffic stops."""

from __future__ import annotations

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.stats import StatsTracker
from serving.tiny_models import tiny_model


def test_queue_wait_percentiles_cover_the_last_window_only():
    tracker = StatsTracker(wait_window_s=60.0)
    tracker.record_admission(arrival_s=0.0, admitted_s=2.0, tier="interactive")  # a 2 s wait
    for t in range(10, 20):
        tracker.record_admission(arrival_s=t, admitted_s=t + 0.1, tier="interactive")
    assert tracker.queue_wait_percentiles(now=20.0)[1] == pytest.approx(2.0)
    # 61 s after the slow one: only the ten 0.1 s waits are left.
    assert tracker.queue_wait_percentiles(now=62.5)[1] == pytest.approx(0.1)
    # A minute without admissions: no queue.
    assert tracker.queue_wait_percentiles(now=200.0) == (0.0, 0.0)


def test_per_tier_median_waits_cover_the_last_window_only():
    tracker = StatsTracker(wait_window_s=60.0)
    tracker.record_admission(arrival_s=0.0, admitted_s=3.0, tier="offline")
    for t in range(10, 13):
        tracker.record_admission(arrival_s=t, admitted_s=t + 0.2, tier="interactive")
    p50 = tracker.queue_wait_p50_by_tier(now=20.0)
    assert p50 == {"offline": pytest.approx(3.0), "interactive": pytest.approx(0.2)}
    # the offline wait is 61 s old: its tier drops out rather than reading as a queue
    assert tracker.queue_wait_p50_by_tier(now=63.5) == {"interactive": pytest.approx(0.2)}
    assert tracker.queue_wait_p50_by_tier(now=200.0) == {}


def test_clear_forgets_waits_tokens_and_counts():
    tracker = StatsTracker()
    tracker.record_admission(0.0, 3.0, "interactive")
    tracker.record_step(3.0, 16)
    tracker.record_output(12)
    tracker.num_finished = 4
    tracker.clear()
    assert tracker.queue_wait_percentiles(now=3.0) == (0.0, 0.0)
    assert tracker.typical_output_tokens() is None
    assert tracker.num_finished == 0
    assert tracker.wait_window_s == 60.0  # the settings survive


def test_an_engine_forgets_a_generation_after_tracker_clear():
    clock = [100.0]
    engine = LLMEngine(
        tiny_model("llama"), config=EngineConfig(num_kv_blocks=16), clock=lambda: clock[0]
    )
    engine.generate([[3, 4, 5]], [SamplingParams(max_tokens=2, temperature=0)])
    assert engine.stats().num_finished == 1
    engine.tracker.clear()  # what a replica does after its self-check
    stats = engine.stats()
    assert (stats.num_finished, stats.queue_wait_p99_s) == (0, 0.0)
