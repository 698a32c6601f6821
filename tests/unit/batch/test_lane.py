"""OfflineLane (serving/batch/lane.py) on a fake LaneHost: no Serve, no ingress, no model.

The lane knows the ingress only through LaneHost: these tests are the contract. What the pools
report becomes the scheduler's LaneView; the lane's own requests never count as live traffic;
the forecast is fed and the estimates shown on the runner's ticks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from serving.batch.lane import COUNTS_EVERY_S, LaneLimits, OfflineLane
from serving.batch.outlook import FORECAST_FILE
from serving.config.batch_api import BatchApiSection
from tests.unit.batch.test_runner import upload

CHAT = "/v1/chat/completions"
LIMITS = LaneLimits(slots_per_replica=8, offline_idle_fraction=0.5, replica_capacity_rps=4.0)


@dataclass
class Load:
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_reserved: int = 0
    kv_blocks_total: int = 100


class FakeHost:
    """The ingress, as the lane sees it: it counts every request it opens, the lane's too."""

    def __init__(self, loads: dict[str, Load], counts: dict[str, int]) -> None:
        self.loads, self.counts = loads, counts
        self.requests = 0  # the ingress's num_requests: live and the lane's
        self.count_reads = 0

    async def run_line(self, url: str, body: dict, opened) -> dict:
        n = body.get("n", 1)
        self.requests += n
        opened(n)
        return {"object": "chat.completion", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}

    async def pool_loads(self) -> dict[str, Load]:
        return self.loads

    def replica_counts(self) -> dict[str, int]:
        self.count_reads += 1
        return self.counts

    def num_requests(self) -> int:
        return self.requests


def lane_for(tmp_path, host: FakeHost, **cfg) -> OfflineLane:
    section = BatchApiSection(store_path=str(tmp_path), **cfg)
    return OfflineLane(section, LIMITS, host, "tideserve", "tiny")


def test_a_view_reads_each_pool_once_and_scales_it_by_its_replica_count(tmp_path):
    host = FakeHost(
        {"hot": Load(running=3, waiting=1, kv_blocks_used=20), "cold": Load(kv_blocks_used=70)},
        {"hot": 2, "cold": 1},
    )
    lane = lane_for(tmp_path, host)
    view = asyncio.run(lane._observe(100.0, batch_in_flight=2))
    assert view.num_replicas == 3
    # 4 held on the hot replica read stands for both: 8, of which 2 are the lane's own
    assert view.live_in_flight == 6 and view.batch_in_flight == 2
    assert view.kv_use_fraction == pytest.approx(0.7)  # the busiest replica's
    assert (view.slots_per_replica, view.offline_idle_fraction) == (8, 0.5)
    assert view.replica_capacity_rps == 4.0 and view.now_s == 100.0


def test_reserved_kv_counts_as_busy_and_a_pool_not_read_is_left_out(tmp_path):
    host = FakeHost({"hot": Load(kv_blocks_used=10, kv_blocks_reserved=40)}, {"hot": 1, "cold": 2})
    view = asyncio.run(lane_for(tmp_path, host)._observe(100.0, 0))
    assert view.kv_use_fraction == pytest.approx(0.4)
    assert view.num_replicas == 1  # cold is running but the ingress does not route to it now


def test_replica_counts_are_read_at_most_every_few_seconds(tmp_path):
    host = FakeHost({"hot": Load()}, {"hot": 1})
    lane = lane_for(tmp_path, host)

    async def views() -> None:
        for now in (100.0, 101.0, 100.0 + COUNTS_EVERY_S - 0.1, 100.0 + COUNTS_EVERY_S):
            await lane._observe(now, 0)

    asyncio.run(views())
    assert host.count_reads == 2


def test_the_lanes_own_requests_are_not_live_traffic(tmp_path):
    host = FakeHost({"hot": Load()}, {"hot": 1})
    lane = lane_for(tmp_path, host)

    async def scenario() -> tuple[float, float]:
        await lane._observe(100.0, 0)
        await lane._execute(CHAT, {"n": 3})  # the lane's line: 3 choices, 3 requests
        host.requests += 2  # two live requests
        first = (await lane._observe(102.0, 0)).live_rate_rps
        await lane._execute(CHAT, {})
        return first, (await lane._observe(103.0, 0)).live_rate_rps

    first, second = asyncio.run(scenario())
    assert first == pytest.approx(1.0)  # 2 live requests in 2 s; the lane's 3 left out
    assert second == 0.0
    assert lane.live_requests() == 2


def test_the_lane_feeds_its_forecast_and_shows_a_forecast_estimate(tmp_path):
    """The per-tick work on the runner's ticks: no estimate before a line is answered, then one
    from the forecast; the ask is the plan's."""
    host = FakeHost({"hot": Load()}, {"hot": 1})
    host.requests = 7
    lane = lane_for(tmp_path, host)
    lane._outlook_tick()  # the ingress started before any batch: an idle plan
    assert lane.outlook.plan.reason == "no open batch"
    batch_id = lane.runner.create(upload(lane.store, 40), CHAT, "1h", None)["id"]
    job = lane.runner.jobs[batch_id]

    async def run() -> list[dict]:
        views = []
        for _ in range(4):
            lane._outlook_tick()
            views.append(job.view(0.0, 0.0)["tideserve"])
            await lane.runner.tick(time.monotonic())
            for _ in range(5):
                await asyncio.sleep(0)
            # the fake path answers at once: the replica-seconds a real replica would have held
            job.lane["replica_s"] = 0.1 * len(job.done)
        return views

    views = asyncio.run(run())
    assert views[0]["estimated_completion_at"] is None
    assert views[0]["estimate_basis"] == "no measure yet"
    later = [v for v in views if v["estimated_completion_at"] is not None]
    assert later and "forecast valleys of 1 replica(s)" in later[0]["estimate_basis"]
    assert later[0]["estimated_completion_at"] <= job.batch["expires_at"]
    assert lane.cold_replicas_wanted() == lane.outlook.plan.cold_replicas == 0
    assert (tmp_path / FORECAST_FILE).exists()  # saved on the first tick
    summary = lane.summary()
    assert summary["store_path"] == str(tmp_path) and summary["cold_replicas_asked"] == 0


def test_the_store_defaults_to_the_apps_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    lane = OfflineLane(BatchApiSection(), LIMITS, FakeHost({}, {}), "myapp", "tiny")
    assert lane.store.root == tmp_path / ".cache" / "tideserve" / "batch" / "myapp"
