"""The offline lane's pure decisions: room beside live traffic, yielding, KV, cold-start advice."""

from __future__ import annotations

import dataclasses

import pytest

from serving.batch.scheduler import (
    LaneView,
    ValleyModel,
    decide_lane,
    estimate_completion,
    live_room,
    plan_cold_start,
    valley_tokens,
)

IDLE = LaneView(
    now_s=100.0,
    num_replicas=2,
    slots_per_replica=8,
    live_in_flight=0,
    live_rate_rps=0.0,
    replica_capacity_rps=2.0,
    batch_in_flight=0,
    kv_use_fraction=0.0,
    offline_idle_fraction=0.5,
    last_refusal_s=None,
)


def decide(view, share=0.5, cap=16, backoff=2.0):
    return decide_lane(view, share, cap, backoff)


def test_idle_replicas_take_share_of_their_slots():
    d = decide(IDLE)
    assert (d.max_in_flight, d.num_to_cancel) == (8, 0)  # 2 x 8 slots x 0.5
    assert decide(IDLE, cap=3).max_in_flight == 3  # max_in_flight is a ceiling


def test_live_requests_in_flight_shrink_the_room():
    assert live_room(dataclasses.replace(IDLE, live_in_flight=10), 0.5, 16) == 3


def test_live_arrival_rate_shrinks_the_room_before_requests_pile_up():
    # 3 req/s on 2 replicas of 2 req/s = 75 % load: a quarter of 16 slots, halved
    assert live_room(dataclasses.replace(IDLE, live_rate_rps=3.0), 0.5, 16) == 2
    assert live_room(dataclasses.replace(IDLE, live_rate_rps=5.0), 0.5, 16) == 0


def test_rising_live_traffic_cancels_the_excess_at_once():
    busy = dataclasses.replace(IDLE, live_in_flight=14, batch_in_flight=6)
    d = decide(busy)
    assert d.max_in_flight == 1 and d.num_to_cancel == 5
    assert "live traffic rose" in d.reason


def test_kv_busy_starts_nothing_new_but_cancels_nothing():
    d = decide(dataclasses.replace(IDLE, kv_use_fraction=0.6, batch_in_flight=3))
    assert (d.max_in_flight, d.num_to_cancel) == (3, 0)
    assert "KV use 60%" in d.reason


def test_a_recent_refusal_holds_the_lane_until_the_backoff_passes():
    refused = dataclasses.replace(IDLE, batch_in_flight=2, last_refusal_s=99.0)
    assert decide(refused).max_in_flight == 2
    assert decide(dataclasses.replace(refused, now_s=101.5)).max_in_flight == 8


def test_no_replica_no_batch_work():
    assert decide(dataclasses.replace(IDLE, num_replicas=0)).max_in_flight == 0


# A day of 24 one-hour bins: night valley at 0.5 req/s, day peak at 3.5 req/s on one hot replica
# of 4 req/s capacity; a fully idle replica does 100 batch tokens/s.
MODEL = ValleyModel(
    bin_s=3600.0, hot_replicas=1, replica_capacity_rps=4.0, batch_tokens_per_replica_s=100.0
)
DAY = [0.5] * 6 + [3.5] * 12 + [0.5] * 6


def test_valley_tokens_follow_the_idle_share():
    tokens = valley_tokens([0.5, 3.5, 4.5], MODEL)
    assert tokens == pytest.approx([0.875 * 360000, 0.125 * 360000, 0.0])


def test_no_cold_start_when_the_valleys_suffice():
    advice = plan_cold_start(0.0, 24 * 3600.0, 1e6, DAY, MODEL, max_cold_replicas=2)
    assert not advice.start_cold and "valleys hold" in advice.reason


def test_cold_start_off_peak_when_the_valleys_fall_short():
    need = 5e6  # the day's valleys hold ~4.3e6
    advice = plan_cold_start(0.0, 24 * 3600.0, need, DAY, MODEL, max_cold_replicas=2)
    assert advice.start_cold and advice.num_replicas == 1
    assert "off-peak now" in advice.reason


def test_never_a_cold_start_at_peak():
    at_peak = DAY[6:] + DAY[:6]  # now is 06:00, the first peak hour
    advice = plan_cold_start(0.0, 24 * 3600.0, 5e6, at_peak, MODEL, max_cold_replicas=2)
    assert not advice.start_cold and "is peak" in advice.reason


def test_cold_replicas_capped():
    advice = plan_cold_start(0.0, 24 * 3600.0, 1e9, DAY, MODEL, max_cold_replicas=2)
    assert advice.num_replicas == 2


def test_estimate_completion_walks_the_forecast():
    # 0.875 x 100 tok/s in the first bin: 315000 tokens end in its middle... of the 2nd bin here
    per_bin = 0.875 * 100 * 3600
    eta = estimate_completion(1000.0, per_bin * 1.5, [0.5, 0.5, 0.5], MODEL)
    assert eta == pytest.approx(1000.0 + 1.5 * 3600.0)
    assert estimate_completion(0.0, 1e12, DAY, MODEL) is None
    assert estimate_completion(5.0, 0, DAY, MODEL) == 5.0


def test_batches_cli_table():
    from serving.batch.cli import format_table

    listing = {
        "data": [
            {
                "id": "batch_1",
                "status": "in_progress",
                "completion_window": "24h",
                "request_counts": {"total": 10, "completed": 3, "failed": 1},
                "tideserve": {
                    "tokens_done": 120,
                    "idle_capacity_used_replica_s": 2.5,
                    "estimated_completion_at": 0.0,
                },
            }
        ],
        "tideserve": {
            "lane_reason": "idle capacity for 4 batch requests",
            "store_path": "/s",
            "cold_replicas_asked": 1,
            "cold_reason": "off-peak now",
        },
    }
    text = format_table(listing)
    header, row, lane, cold = text.splitlines()
    assert cold == "cold pool: 1 replica(s) asked (off-peak now)"
    assert header.split() == ["id", "status", "done/total", "failed", "tokens", "idle_rep_s",
                              "eta_utc", "window"]  # fmt: skip
    assert row.split() == ["batch_1", "in_progress", "4/10", "1", "120", "2.5", "00:00:00", "24h"]
    assert "idle capacity for 4" in lane


def test_batches_cli_prints_the_table_of_the_listing(monkeypatch, capsys):
    import httpx

    from tideserve.cli import main

    listing = {"data": [], "tideserve": {"lane_reason": "idle", "store_path": "/s"}}
    seen = {}

    def fake_get(url, **kwargs):
        seen["url"] = url
        return httpx.Response(200, json=listing)

    monkeypatch.setattr(httpx, "get", fake_get)
    assert main(["batches", "--url", "http://h:1/"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert seen["url"] == "http://h:1/v1/batches"
    assert lines[0].split()[0] == "id" and lines[-2].startswith("lane: idle")
