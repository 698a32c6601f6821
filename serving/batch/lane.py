"""The ingress side of the offline lane: builds the BatchRunner, runs a batch line through the
ingress's own request path in the offline tier, and observes the replicas for the scheduler.

A mixin of HttpIngress (it uses the ingress's handles, tokenizer and `_answer`); the runner
itself (serving/batch/runner.py) knows nothing of Serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from serving.api import openai as p
from serving.api.errors import check_model_name
from serving.api.http import validate
from serving.batch import jobs
from serving.batch.outlook import LaneOutlook, batch_needs, plan_bin_s, valley_model
from serving.batch.runner import BatchRunner
from serving.batch.scheduler import LaneView
from serving.batch.store import BatchStore
from serving.llm import tools
from serving.llm.admission import max_in_replica
from serving.serve_status import running_replicas

log = logging.getLogger("ray.serve")
COUNTS_EVERY_S = 5.0  # replica counts come from the Serve controller: not every tick


class LaneMixin:
    def start_lane(self, lane_args: dict | None) -> None:
        """Open the store and resume every unfinished batch (called from the constructor)."""
        from serving.config import AppConfig

        cfg = AppConfig.from_args(lane_args or {})
        self.lane_cfg = cfg.batch
        self.lane_capacity_rps = cfg.controller.replica_capacity_rps
        root = self.lane_cfg.store_path or os.path.join(
            os.path.expanduser("~"), ".cache", "tideserve", "batch", self.app_name
        )
        self.lane = BatchRunner(
            BatchStore(root),
            self.lane_cfg,
            self._lane_execute,
            self._lane_observe,
            jobs.GENERATE_ENDPOINTS,
            self.model_name,
        )
        self.lane_outlook = LaneOutlook(self.lane.store.root)  # the lane's own forecast
        self._lane_task: asyncio.Task | None = None
        self._lane_opens = 0  # requests the lane opened (n per line), to tell live ones apart
        self._lane_last = (time.monotonic(), 0)  # (when, live requests counted) at the last view
        self._lane_counts: dict[str, int] = {}
        self._lane_counts_at = -COUNTS_EVERY_S
        # Serve runs the constructor on the replica's event loop: resume at once. Without a
        # loop (a unit test building the class) the first batch request starts it.
        with contextlib.suppress(RuntimeError):
            self.ensure_lane_running()

    def ensure_lane_running(self) -> None:
        if self._lane_task is None or self._lane_task.done():
            loop = asyncio.get_running_loop()
            self._lane_task = loop.create_task(self.lane.run(self._lane_outlook_tick))

    def offline_cold_replicas_wanted(self) -> int:
        """Cold replicas the batch lane asks for now: 0 at peak, and 0 while the forecast
        valleys hold the open batches' remaining work (serving/batch/outlook.py). The cold
        pool's scaling reads this and keeps at least that many cold replicas (within the
        pool's bounds)."""
        return self.lane_outlook.plan.cold_replicas

    def _lane_outlook_tick(self) -> None:
        """Every lane tick: feed the forecast the live arrivals (the lane's own excluded); every
        PLAN_EVERY_S, the cold-pool ask and each open batch's completion estimate."""
        now, outlook = time.time(), self.lane_outlook
        outlook.count(now, self.num_requests - self._lane_opens)
        live = [j for j in self.lane.jobs.values() if j.batch["status"] == "in_progress"]
        if outlook.due(now, len(live)):
            # Hot only: cold replicas the lane asked for must not shrink its own ask. Before the
            # first count from the controller (the lane's first tick), hot has >= 1 replica.
            hot = self._lane_counts.get("hot", 1)
            model = valley_model(
                self.lane.jobs.values(),
                plan_bin_s(outlook.forecaster),
                hot,
                self.lane_capacity_rps,
                self.lane_cfg.slot_share,
            )
            needs, max_cold = batch_needs(live), self.lane_cfg.max_cold_replicas
            plan = outlook.replan(now, len(live), needs, model, max_cold)
            for job in live:
                at = plan.estimates.get(job.batch["id"])
                job.lane["estimate"] = {
                    "completion_at": None if at is None else round(at, 1),
                    "basis": plan.basis or plan.reason,
                }
        outlook.save(now)

    def lane_summary(self) -> dict:
        last, view = self.lane.last, self.lane.last_view
        return {
            "lane_reason": last.reason if last else "idle",
            "max_in_flight": last.max_in_flight if last else 0,
            "kv_use_fraction": view.kv_use_fraction if view else None,
            "live_rate_rps": view.live_rate_rps if view else None,
            "idle_capacity_used_replica_s": round(self.lane.replica_s_total, 3),
            "cold_replicas_asked": self.lane_outlook.plan.cold_replicas,
            "cold_reason": self.lane_outlook.plan.reason,
            "live_rate_forecast_basis": self.lane_outlook.forecaster.predict(time.time(), 0).basis,
            "store_path": str(self.lane.store.root),
        }

    async def _lane_execute(self, url: str, body: dict) -> dict:
        """One batch line, in the offline tier whatever its body says."""
        kind = p.ChatCompletionRequest if url == jobs.CHAT else p.CompletionRequest
        req = validate(kind, {**body, "priority": "offline"})
        check_model_name(req.model, self.model_name)
        self._lane_opens += req.num_choices
        if kind is p.ChatCompletionRequest:
            plan = tools.plan_for(req)
            return await self._answer(req, "offline", self._encode_chat(req, plan), plan)
        return await self._answer(req, "offline", self._encode_prompt(req.prompt), None)

    async def _lane_observe(self, now_s: float, batch_in_flight: int) -> LaneView:
        await self.ensure_watching()
        if now_s - self._lane_counts_at >= COUNTS_EVERY_S:
            self._lane_counts_at = now_s
            try:
                self._lane_counts = await asyncio.to_thread(running_replicas, self.app_name)
            except Exception as err:  # keep the last counts; the controller may be restarting
                log.warning("batch lane: replica counts unavailable: %s", err)
        pools = [pool for pool, ok in self.available.items() if ok]
        infos = await asyncio.gather(
            *(asyncio.wait_for(self.handles[pool].info.remote(), 10) for pool in pools),
            return_exceptions=True,
        )
        held, kv, replicas = 0.0, 0.0, 0
        for pool, info in zip(pools, infos, strict=True):
            if isinstance(info, BaseException):
                continue
            count = max(1, self._lane_counts.get(pool, 1))
            replicas += count
            held += (info.running + info.waiting) * count  # one replica read stands for its pool
            busy = max(info.kv_blocks_used, info.kv_blocks_reserved)
            kv = max(kv, busy / max(info.kv_blocks_total, 1))
        last_s, last_live = self._lane_last
        live = self.num_requests - self._lane_opens
        self._lane_last = (now_s, live)
        rate = (live - last_live) / max(now_s - last_s, 1e-3)
        rep, engine = self.config.replica, self.config.engine
        return LaneView(
            now_s=now_s,
            num_replicas=replicas,
            slots_per_replica=min(
                max_in_replica("offline", rep.max_ongoing_requests), engine.max_num_seqs
            ),
            live_in_flight=max(0, round(held) - batch_in_flight),
            live_rate_rps=max(0.0, rate),
            replica_capacity_rps=self.lane_capacity_rps,
            batch_in_flight=batch_in_flight,
            kv_use_fraction=kv,
            offline_idle_fraction=engine.offline_idle_fraction,
            last_refusal_s=self.lane.last_refusal_s,
        )
