"""The replay's offline pass: a daily batch fills what live traffic leaves idle."""

from __future__ import annotations

import numpy as np
import pytest

from autoscaling.replay.offline import DAY_S, OfflineLoad, fill_valleys


def test_batch_fills_idle_capacity_and_reports_gpu_hours():
    # two days, 2 replicas of 1 req/s; live traffic 1.5 req/s by day (8 h), 0 at night
    t = np.arange(2 * DAY_S)
    live = np.where((t % DAY_S >= 8 * 3600) & (t % DAY_S < 16 * 3600), 1.5, 0.0)
    ready = np.full(len(t), 2.0)
    out = fill_valleys(live, ready, 0.0, 1.0, OfflineLoad(requests_per_day=50000, slot_share=0.5))
    # idle: 0.5 req/s for 8 h, 2 req/s for 16 h; the lane takes half: 7200 + 57600 per day
    assert out["idle_gpu_hours_before"] == pytest.approx(2 * (0.5 * 8 + 2 * 16))
    assert out["offline_served"] == pytest.approx(100000)
    assert out["valley_gpu_hours_used"] == pytest.approx(100000 / 3600)
    assert out["idle_gpu_hours_after"] == pytest.approx(72 - 100000 / 3600)
    assert (out["days_batch_done"], out["days_judged"]) == (2, 2)


def test_a_batch_larger_than_the_valleys_is_reported_unfinished():
    t = np.arange(DAY_S)
    out = fill_valleys(np.zeros(len(t)), np.ones(len(t)), 0.0, 1.0, OfflineLoad(1e6, 1.0))
    assert out["days_batch_done"] == 0 and out["offline_left_last_day"] == pytest.approx(
        1e6 - DAY_S
    )


def test_offline_load_validates():
    with pytest.raises(ValueError, match="slot_share"):
        OfflineLoad(10, slot_share=0)
    with pytest.raises(ValueError, match="requests_per_day"):
        OfflineLoad(-1)


def _two_days_busy_by_day():
    t = np.arange(2 * DAY_S)
    live = np.where((t % DAY_S >= 8 * 3600) & (t % DAY_S < 16 * 3600), 1.0, 0.1)
    return live, np.ones(len(t))  # one replica of 1 req/s: the day is full, the night is idle


def test_a_short_day_starts_cold_replicas_off_peak_only():
    live, ready = _two_days_busy_by_day()
    need = 60000  # the night's lane holds 0.45 req/s x 16 h ~ 26 000
    plain = fill_valleys(live, ready, 0.0, 1.0, OfflineLoad(need, 0.5))
    cold = fill_valleys(live, ready, 0.0, 1.0, OfflineLoad(need, 0.5, max_cold_replicas=3))
    assert plain["days_batch_done"] == 0 and plain["cold_gpu_hours_for_batch"] == 0
    # day 0 has no previous day to forecast from; day 1 forecasts from day 0
    assert cold["days_cold_started"] == 1 and cold["cold_gpu_hours_for_batch"] > 0
    assert cold["offline_served"] > plain["offline_served"]
    # cold replicas never ran in the peak hours: their GPU-hours fit in the 16 off-peak hours
    assert cold["cold_gpu_hours_for_batch"] <= 3 * 16
