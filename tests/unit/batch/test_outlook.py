"""The offline lane's outlook: the cold-pool ask and the completion estimates from a forecast.

Forecasts are constructed (bin lists, or a Forecaster fed a known day); time is passed in.
"""

from __future__ import annotations

import json
import math

import pytest

from autoscaling.forecast import ForecastConfig, Forecaster
from serving.batch.job import Job
from serving.batch.outlook import (
    FEED_EVERY_S,
    FORECAST_FILE,
    BatchNeed,
    LaneOutlook,
    batch_needs,
    forecast_bins,
    plan_lane,
    valley_model,
)
from serving.batch.scheduler import estimate_completion
from tests.unit.batch.test_scheduler import DAY, MODEL

CHAT = "/v1/chat/completions"

H = 3600.0
NIGHT_RATE = 0.5  # DAY: 6 h of night at 0.5 req/s, 12 h of day at 3.5, 6 h of night
SHORT = 5e6  # more than the day's valleys hold (~4.3e6 tokens): a cold start is needed
EASY = 1e6  # the valleys hold it


def need(tokens: float, deadline_s: float = 24 * H, batch_id: str = "batch_a") -> BatchNeed:
    return BatchNeed(batch_id, deadline_s, tokens)


def test_no_open_batch_asks_nothing():
    plan = plan_lane(0.0, [], DAY, MODEL, NIGHT_RATE, max_cold_replicas=2)
    assert plan.cold_replicas == 0 and plan.estimates == {}


def test_valleys_that_hold_the_work_ask_nothing_and_estimate_from_the_forecast():
    plan = plan_lane(0.0, [need(EASY)], DAY, MODEL, NIGHT_RATE, max_cold_replicas=2)
    assert plan.cold_replicas == 0
    assert plan.estimates["batch_a"] == pytest.approx(estimate_completion(0.0, EASY, DAY, MODEL))
    assert "forecast valleys of 1 replica(s)" in plan.basis


def test_off_peak_and_short_asks_the_cold_pool_and_the_estimate_counts_it():
    plan = plan_lane(0.0, [need(SHORT)], DAY, MODEL, NIGHT_RATE, max_cold_replicas=2)
    assert plan.cold_replicas == 1, plan.reason
    hot_only = estimate_completion(0.0, SHORT, DAY, MODEL)
    assert hot_only is None or plan.estimates["batch_a"] < hot_only
    assert plan.estimates["batch_a"] is not None and "+ 1 cold" in plan.basis


def test_never_an_ask_at_peak_by_the_forecast():
    at_peak = DAY[6:] + DAY[:6]  # now is 06:00, the first day hour
    plan = plan_lane(0.0, [need(SHORT)], at_peak, MODEL, 3.5, max_cold_replicas=2)
    assert plan.cold_replicas == 0 and "is peak" in plan.reason


def test_never_an_ask_while_the_live_rate_now_is_peak_whatever_the_forecast_says():
    plan = plan_lane(0.0, [need(SHORT)], DAY, MODEL, live_rate_rps=3.0, max_cold_replicas=2)
    assert plan.cold_replicas == 0 and "live rate now 3.00 req/s is peak" in plan.reason


def test_the_ask_is_capped_and_zero_when_the_lane_may_not_ask():
    assert plan_lane(0.0, [need(1e9)], DAY, MODEL, NIGHT_RATE, 2).cold_replicas == 2
    assert plan_lane(0.0, [need(1e9)], DAY, MODEL, NIGHT_RATE, 0).cold_replicas == 0


def test_without_a_throughput_measure_there_is_no_ask_and_no_estimate():
    plan = plan_lane(0.0, [need(SHORT)], DAY, None, NIGHT_RATE, max_cold_replicas=2)
    assert plan.cold_replicas == 0 and plan.estimates == {}
    assert "no batch throughput measured" in plan.reason


def test_batches_are_planned_earliest_deadline_first_with_the_work_due_before_them():
    # each alone fits the day's valleys; together, the later one's deadline needs a cold replica
    early, late = need(3e6, 24 * H, "batch_early"), need(2e6, 24 * H + 1, "batch_late")
    assert plan_lane(0.0, [early], DAY, MODEL, NIGHT_RATE, 2).cold_replicas == 0
    plan = plan_lane(0.0, [late, early], DAY, MODEL, NIGHT_RATE, 2)
    assert plan.cold_replicas == 1 and plan.reason.startswith("batch_late")
    assert plan.estimates["batch_early"] < plan.estimates["batch_late"]


def daily(t_s: float) -> float:
    """0.5 req/s from 18:00 to 06:00, 3.5 req/s from 06:00 to 18:00 (the DAY of the bins)."""
    return 3.5 if 6 * H <= t_s % (24 * H) < 18 * H else 0.5


def trained(days: int = 3) -> Forecaster:
    f = Forecaster(ForecastConfig(bin_s=H, profile_weight=1.0))
    t = 60.0
    while t < days * 24 * H:
        f.observe(t, daily(t))
        t += 300.0
    return f


def test_a_forecaster_fed_a_known_day_asks_at_night_and_never_at_noon():
    f = trained()
    model = MODEL
    night = 3 * 24 * H + 1 * H  # 01:00 of day 4
    bins = forecast_bins(f, night, 24)
    assert bins[0] < 1.0 and max(bins) > 3.0
    plan = plan_lane(night, [need(SHORT, night + 23 * H)], bins, model, daily(night), 2)
    assert plan.cold_replicas >= 1, plan.reason
    noon = night + 11 * H
    bins = forecast_bins(f, noon, 24)
    plan = plan_lane(noon, [need(SHORT, noon + 23 * H)], bins, model, daily(noon), 2)
    assert plan.cold_replicas == 0 and "peak" in plan.reason


def test_live_counts_feed_the_forecast_and_a_restart_keeps_it(tmp_path):
    outlook = LaneOutlook(tmp_path, ForecastConfig(bin_s=H))
    t, total = 1000.0, 0
    for _ in range(30):  # 2 req/s, counted every second
        outlook.count(t, total)
        t, total = t + 1.0, total + 2
    assert outlook.last_rate_rps == pytest.approx(2.0)
    assert outlook.forecaster.level_rps() == pytest.approx(2.0)
    outlook.save(t)
    again = LaneOutlook(tmp_path)
    assert again.forecaster.to_dict() == outlook.forecaster.to_dict()
    assert json.loads((tmp_path / FORECAST_FILE).read_text())["config"]["bin_s"] == H
    # a new ingress counts from 0 again: it starts a new interval, never a negative rate
    again.count(t, 0)
    again.count(t + FEED_EVERY_S, 10)
    assert again.last_rate_rps == pytest.approx(10 / FEED_EVERY_S)


def test_an_unreadable_forecast_file_starts_a_new_forecast(tmp_path):
    (tmp_path / FORECAST_FILE).write_text("{not json")
    assert LaneOutlook(tmp_path).forecaster.level_rps() is None


def job(batch_id: str, num_lines: int, answered_tokens: list[int], replica_s: float) -> Job:
    done = {i: {"index": i} for i in range(len(answered_tokens))}
    record = {
        "batch": {
            "id": batch_id,
            "expires_at": 100,
            "usage": {"total_tokens": sum(answered_tokens)},
        },
        "lane": {"replica_s": replica_s},
    }
    return Job(record, dict.fromkeys(range(num_lines)), done)


def test_remaining_tokens_and_the_measured_throughput_come_from_the_answers():
    a = job("batch_a", 10, [20, 20], replica_s=2.0)  # 8 lines left x 20 tokens
    b = job("batch_b", 5, [], replica_s=0.0)  # sized by the lane's mean: 40 / 2 per line
    needs = {n.batch_id: n.remaining_tokens for n in batch_needs([a, b])}
    assert needs == {"batch_a": 160.0, "batch_b": 100.0}
    model = valley_model([a, b], H, replicas=2, capacity_rps=4.0, slot_share=0.5)
    assert model.batch_tokens_per_replica_s == pytest.approx(40 / 2.0 * 0.5)
    assert model.hot_replicas == 2 and model.bin_s == H
    assert valley_model([b], H, 1, 4.0, 0.5) is None  # nothing measured yet
    assert batch_needs([b]) == []


def test_the_estimate_is_the_forecast_walk_not_the_pace():
    flat = [NIGHT_RATE] * 24
    plan = plan_lane(0.0, [need(1e5)], flat, MODEL, NIGHT_RATE, 2)
    per_s = (1 - NIGHT_RATE / MODEL.replica_capacity_rps) * MODEL.batch_tokens_per_replica_s
    assert plan.estimates["batch_a"] == pytest.approx(1e5 / per_s)
    assert not math.isinf(plan.estimates["batch_a"])
