"""The ingress's view of its two pools: which may take requests now, and what their replicas hold.

A part of the Ingress (serving/llm/ingress.py). `available` is the dict the dispatcher reads
(serving/llm/dispatch.py): cold is used only while it has a running replica (an empty pool would
park requests until one appears); either pool is refused outright if its replicas report another
config fingerprint than the ingress's (R9). `view()` reads one replica of each available pool,
typed, for the offline lane (serving/batch/lane.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.llm.messages import ReplicaInfo
from serving.serve_status import running_replicas

log = logging.getLogger("ray.serve")
INFO_TIMEOUT_S = 10.0  # one replica's info(); a pool that does not answer is left out of a view


@dataclass(frozen=True, slots=True)
class PoolView:
    """One replica's reading of each pool the ingress routes to now (a failed read is left out).

    The replicas of one pool share a config and the router spreads load over them, so one
    replica's reading stands for each of its pool's replicas."""

    infos: Mapping[str, ReplicaInfo]


class PoolWatch:
    def __init__(self, handles: Mapping[str, Any], fingerprint: str, app_name: str) -> None:
        self.handles = dict(handles)
        self.fingerprint = fingerprint
        self.app_name = app_name
        # Hot always has >= 1 replica (config-enforced), so requests may wait on Serve's queue
        # for it; cold may have none, and is used only once the watcher has seen it running.
        self.available = {"hot": True, "cold": False}
        self.verified: dict[str, bool] = {}
        self.emptying: set[str] = set()  # pools the forecast controller is scaling to zero
        self._watcher: asyncio.Task | None = None
        self._first_poll: asyncio.Task | None = None  # the poll a fresh ingress's requests await

    async def _watch_pools(self, first_poll: asyncio.Future, period_s: float = 2.0) -> None:
        await asyncio.shield(first_poll)
        while True:
            await asyncio.sleep(period_s)
            await self._poll_pools()

    async def _poll_pools(self) -> None:
        try:
            counts = await asyncio.to_thread(running_replicas, self.app_name)
            for pool in self.handles:
                if pool not in counts:  # mid-deploy the status may omit it: keep the last view
                    continue
                running = counts[pool] > 0 and pool not in self.emptying
                ok = await self._fingerprint_ok(pool) if running else pool == "hot"
                self.available[pool] = ok
        except Exception as err:  # the controller may be restarting; keep the last view
            log.warning("pool status poll failed: %s", err)

    async def _fingerprint_ok(self, pool: str) -> bool:
        if pool not in self.verified:
            theirs = await asyncio.wait_for(self.handles[pool].fingerprint.remote(), 30)
            self.verified[pool] = theirs == self.fingerprint
            if not self.verified[pool]:
                log.error(
                    "%s replicas run config %s, ingress has %s: not routing to them",
                    pool,
                    theirs[:12],
                    self.fingerprint[:12],
                )
        return self.verified[pool]

    async def ensure_watching(self) -> None:
        """The first request waits for one poll, so a fresh ingress does not answer 503.

        One watcher per ingress: the check and the start have no await between them, so the
        requests of a first burst share one poll and one watcher. (With the poll awaited before
        the start, each request of the burst started a watcher of its own; after 16 concurrent
        first requests, 16 watchers called serve.status(), tens of ms of CPU each, 8 times a
        second: half a core of a 2-core machine, at idle.)"""
        if self._watcher is None or self._watcher.done():
            loop = asyncio.get_running_loop()
            self._first_poll = loop.create_task(self._poll_pools())
            self._watcher = loop.create_task(self._watch_pools(self._first_poll))
        # shielded: a request that goes away must not cancel the poll the others wait for
        await asyncio.shield(self._first_poll)

    def set_target(self, pool: str, target: int) -> None:
        """The forecast controller announces a new replica target before it applies it. A pool
        going to zero gets no new request from now on, not one status poll later: Serve's handle
        would park a request for an empty deployment until a replica comes back."""
        if target == 0 and pool != "hot":
            self.emptying.add(pool)
            self.available[pool] = False
        else:
            self.emptying.discard(pool)  # the watcher marks it available once a replica runs

    async def view(self) -> PoolView:
        """One replica's info() from each pool available now."""
        await self.ensure_watching()
        pools = [pool for pool, ok in self.available.items() if ok]
        infos = await asyncio.gather(
            *(asyncio.wait_for(self.handles[pool].info.remote(), INFO_TIMEOUT_S) for pool in pools),
            return_exceptions=True,
        )
        read = {p: i for p, i in zip(pools, infos, strict=True) if not isinstance(i, BaseException)}
        return PoolView(read)
