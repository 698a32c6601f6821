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
            self._lane_task = asyncio.get_running_loop().create_task(self.lane.run())

    def offline_cold_replicas_wanted(self) -> int:
        """Cold replicas the batch lane asks for now: 0 at peak, and 0 while the forecast
        valleys hold the open batches' remaining work. The cold pool's scaling reads this and
        keeps at least that many cold replicas (within the pool's bounds)."""
        return 0

    def lane_summary(self) -> dict:
        last, view = self.lane.last, self.lane.last_view
        return {
            "lane_reason": last.reason if last else "idle",
            "max_in_flight": last.max_in_flight if last else 0,
            "kv_use_fraction": view.kv_use_fraction if view else None,
            "live_rate_rps": view.live_rate_rps if view else None,
            "idle_capacity_used_replica_s": round(self.lane.replica_s_total, 3),
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
