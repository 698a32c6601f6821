"""OfflineLane: the Batch API's part of the LLM ingress. It holds the runner (the store, the jobs
and the loop that runs batch lines in the offline tier), the lane's own forecast
(serving/batch/outlook.py), and turns what the pools report into the scheduler's LaneView.

It knows the ingress only through LaneHost, the four things it asks of it; serving/routes/
composes the two (serving/routes/lane_host.py). Nothing here speaks HTTP or imports
serving/llm/: the runner (serving/batch/runner.py) knows nothing of Serve either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from serving.batch import jobs
from serving.batch.outlook import LaneOutlook, batch_needs, plan_bin_s, valley_model
from serving.batch.runner import BatchRunner
from serving.batch.scheduler import LaneView
from serving.batch.store import BatchStore
from serving.config.batch_api import BatchApiSection

log = logging.getLogger("ray.serve")
COUNTS_EVERY_S = 5.0  # replica counts come from the Serve controller: not every tick


class ReplicaLoad(Protocol):
    """What the lane reads of one replica (serving/llm/messages.py's ReplicaInfo has it)."""

    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_reserved: int
    kv_blocks_total: int


class LaneHost(Protocol):
    """What the offline lane needs of the ingress that holds it."""

    async def run_line(self, url: str, body: dict, opened: Callable[[int], None]) -> dict:
        """One batch line through the ingress's request path, in the offline tier whatever its
        body says. It calls `opened(n)` with the requests it opens (n choices) before it awaits
        them; an ApiError is the line's answer (a 429/503 puts the line back)."""
        ...

    async def pool_loads(self) -> Mapping[str, ReplicaLoad]:
        """One replica's reading of each pool the ingress routes to now."""
        ...

    def replica_counts(self) -> Mapping[str, int]:
        """Running replicas per pool (blocking: a Serve controller call; run in a thread)."""
        ...

    def num_requests(self) -> int:
        """Requests that reached pool choice since the ingress started, the lane's included."""
        ...


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """The app config's numbers the lane's scheduler reads; fixed for the ingress's life."""

    slots_per_replica: int  # requests one replica holds for the lower tiers (admission's limit)
    offline_idle_fraction: float  # engine.offline_idle_fraction
    replica_capacity_rps: float  # controller.replica_capacity_rps


def default_store_root(app_name: str) -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "tideserve", "batch", app_name)


class OfflineLane:
    def __init__(
        self, cfg: BatchApiSection, limits: LaneLimits, host: LaneHost, app_name: str, model: str
    ) -> None:
        """Open the store and resume every unfinished batch."""
        self.cfg, self.limits, self.host = cfg, limits, host
        root = cfg.store_path or default_store_root(app_name)
        self.runner = BatchRunner(
            BatchStore(root), cfg, self._execute, self._observe, jobs.GENERATE_ENDPOINTS, model
        )
        self.store = self.runner.store
        self.outlook = LaneOutlook(self.store.root)  # the lane's own forecast
        self._task: asyncio.Task | None = None
        self._opens = 0  # requests the lane opened (n per line), to tell live ones apart
        self._last = (time.monotonic(), 0)  # (when, live requests counted) at the last view
        self._counts: dict[str, int] = {}
        self._counts_at = -COUNTS_EVERY_S
        # Serve runs the ingress's constructor on the replica's event loop: resume at once.
        # Without a loop (a unit test) the first batch request starts it.
        with contextlib.suppress(RuntimeError):
            self.ensure_running()

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self.runner.run(self._outlook_tick))

    def cold_replicas_wanted(self) -> int:
        """Cold replicas the batch lane asks for now: 0 at peak, and 0 while the forecast
        valleys hold the open batches' remaining work (serving/batch/outlook.py). The cold
        pool's scaling reads this and keeps at least that many cold replicas (within the
        pool's bounds)."""
        return self.outlook.plan.cold_replicas

    def live_requests(self) -> int:
        """The ingress's requests that were not the lane's own."""
        return self.host.num_requests() - self._opens

    def summary(self) -> dict:
        """tideserve's numbers of the lane, under `tideserve` in GET /v1/batches."""
        last, view, plan = self.runner.last, self.runner.last_view, self.outlook.plan
        return {
            "lane_reason": last.reason if last else "idle",
            "max_in_flight": last.max_in_flight if last else 0,
            "kv_use_fraction": view.kv_use_fraction if view else None,
            "live_rate_rps": view.live_rate_rps if view else None,
            "idle_capacity_used_replica_s": round(self.runner.replica_s_total, 3),
            "cold_replicas_asked": plan.cold_replicas,
            "cold_reason": plan.reason,
            "live_rate_forecast_basis": self.outlook.forecaster.predict(time.time(), 0).basis,
            "store_path": str(self.store.root),
        }

    def _outlook_tick(self) -> None:
        """Every lane tick: feed the forecast the live arrivals (the lane's own excluded); every
        PLAN_EVERY_S, the cold-pool ask and each open batch's completion estimate."""
        now, outlook, runner = time.time(), self.outlook, self.runner
        outlook.count(now, self.live_requests())
        live = [j for j in runner.jobs.values() if j.batch["status"] == "in_progress"]
        if outlook.due(now, len(live)):
            # Hot only: cold replicas the lane asked for must not shrink its own ask. Before the
            # first count from the controller (the lane's first tick), hot has >= 1 replica.
            hot = self._counts.get("hot", 1)
            model = valley_model(
                runner.jobs.values(),
                plan_bin_s(outlook.forecaster),
                hot,
                self.limits.replica_capacity_rps,
                self.cfg.slot_share,
            )
            needs, max_cold = batch_needs(live), self.cfg.max_cold_replicas
            plan = outlook.replan(now, len(live), needs, model, max_cold)
            for job in live:
                at = plan.estimates.get(job.batch["id"])
                job.lane["estimate"] = {
                    "completion_at": None if at is None else round(at, 1),
                    "basis": plan.basis or plan.reason,
                }
        outlook.save(now)

    def _opened(self, num_requests: int) -> None:
        self._opens += num_requests

    async def _execute(self, url: str, body: dict) -> dict:
        return await self.host.run_line(url, body, self._opened)

    async def _observe(self, now_s: float, batch_in_flight: int) -> LaneView:
        if now_s - self._counts_at >= COUNTS_EVERY_S:
            self._counts_at = now_s
            try:
                self._counts = dict(await asyncio.to_thread(self.host.replica_counts))
            except Exception as err:  # keep the last counts; the controller may be restarting
                log.warning("batch lane: replica counts unavailable: %s", err)
        loads = await self.host.pool_loads()
        held, kv, replicas = 0.0, 0.0, 0
        for pool, load in loads.items():
            count = max(1, self._counts.get(pool, 1))
            replicas += count
            held += (load.running + load.waiting) * count  # one replica read stands for its pool
            busy = max(load.kv_blocks_used, load.kv_blocks_reserved)
            kv = max(kv, busy / max(load.kv_blocks_total, 1))
        last_s, last_live = self._last
        live = self.live_requests()
        self._last = (now_s, live)
        rate = (live - last_live) / max(now_s - last_s, 1e-3)
        return LaneView(
            now_s=now_s,
            num_replicas=replicas,
            slots_per_replica=self.limits.slots_per_replica,
            live_in_flight=max(0, round(held) - batch_in_flight),
            live_rate_rps=max(0.0, rate),
            replica_capacity_rps=self.limits.replica_capacity_rps,
            batch_in_flight=batch_in_flight,
            kv_use_fraction=kv,
            offline_idle_fraction=self.limits.offline_idle_fraction,
            last_refusal_s=self.runner.last_refusal_s,
        )
