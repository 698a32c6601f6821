"""Cold-start tracker: requested -> running, matched by count, time passed in."""

from __future__ import annotations

import pytest

from autoscaling.cold_start import ColdStartTracker
from common.stats import percentile


def test_each_rise_of_the_running_count_completes_the_oldest_request():
    tracker = ColdStartTracker()
    tracker.observe_running(0, t_s=100.0)  # baseline
    tracker.requested(2, t_s=100.0)
    tracker.requested(1, t_s=110.0)
    assert tracker.observe_running(1, t_s=130.0) == [30.0]
    assert tracker.observe_running(3, t_s=150.0) == [50.0, 40.0]
    assert tracker.num_pending == 0
    assert list(tracker.samples_s) == [30.0, 50.0, 40.0]


def test_a_rise_nobody_asked_for_is_not_a_cold_start():
    tracker = ColdStartTracker()
    tracker.observe_running(2, t_s=0.0)
    tracker.observe_running(1, t_s=5.0)  # a replica crashed...
    assert tracker.observe_running(2, t_s=9.0) == []  # ...and Serve replaced it on its own
    assert tracker.p95_s() is None


def test_a_lowered_target_cancels_the_newest_pending_requests():
    tracker = ColdStartTracker()
    tracker.observe_running(0, t_s=0.0)
    tracker.requested(1, t_s=0.0)
    tracker.requested(1, t_s=20.0)
    tracker.cancelled(1)  # the 20 s request is dropped, the oldest still counts
    assert tracker.observe_running(1, t_s=25.0) == [25.0]
    assert tracker.num_pending == 0


def test_p95_is_nearest_rank_and_samples_restore_from_history():
    tracker = ColdStartTracker(samples_s=[float(i) for i in range(1, 21)], max_samples=64)
    assert tracker.p95_s() == 19.0  # ceil(0.95 x 20) = 19th of 1..20
    assert percentile([], 95, empty=None) is None
    assert percentile([7.0], 95) == 7.0


def test_sample_memory_is_bounded_and_drops_invalid_history():
    tracker = ColdStartTracker(samples_s=[1.0, float("nan"), -3.0, 2.0, 3.0], max_samples=2)
    assert list(tracker.samples_s) == [2.0, 3.0]
    with pytest.raises(ValueError, match="max_samples"):
        ColdStartTracker(max_samples=0)
