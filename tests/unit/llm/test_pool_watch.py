"""The ingress's pool watcher (serving/llm/pool_watch.py): one per ingress, however many requests
arrive at once while it starts. Each poll reads serve.status(), tens of ms of CPU; a watcher per
request of the first burst burned half a core of a 2-core machine at idle."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serving.llm import pool_watch as pool_watch_mod
from serving.llm.pool_watch import PoolWatch


def _watch() -> PoolWatch:
    return PoolWatch({"hot": object(), "cold": object()}, "fingerprint", "tideserve")


@pytest.fixture
def status_reads(monkeypatch):
    """serve.status() stand-in: counts its calls; slow enough that a burst arrives during one."""
    calls, lock = [], threading.Lock()

    def running_replicas(app_name: str) -> dict[str, int]:
        with lock:
            calls.append(app_name)
        threading.Event().wait(0.05)
        return {"hot": 1, "cold": 0}

    monkeypatch.setattr(pool_watch_mod, "running_replicas", running_replicas)
    return calls


def _watchers() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_watch_pools"]


def test_a_burst_of_first_requests_shares_one_poll_and_one_watcher(status_reads):
    ing = _watch()

    async def burst() -> int:
        await asyncio.gather(*(ing.ensure_watching() for _ in range(16)))
        num_watchers = len(_watchers())
        ing._watcher.cancel()
        return num_watchers

    assert asyncio.run(burst()) == 1
    assert status_reads == ["tideserve"]  # one poll answered all 16
    assert ing.available == {"hot": True, "cold": False}


def test_a_request_that_leaves_during_the_first_poll_does_not_cancel_it(status_reads):
    ing = _watch()

    async def scenario() -> bool:
        leaving = asyncio.create_task(ing.ensure_watching())
        await asyncio.sleep(0)  # it has started the poll and waits on it
        leaving.cancel()
        await ing.ensure_watching()  # the next request waits for the same poll, not a new one
        alive = not ing._watcher.done()
        ing._watcher.cancel()
        return alive

    assert asyncio.run(scenario())
    assert status_reads == ["tideserve"]


def test_a_watcher_that_stopped_is_started_again(status_reads):
    ing = _watch()

    async def scenario() -> int:
        await ing.ensure_watching()
        ing._watcher.cancel()
        await asyncio.sleep(0)  # let the cancellation land
        await ing.ensure_watching()
        num_watchers = len(_watchers())
        ing._watcher.cancel()
        return num_watchers

    assert asyncio.run(scenario()) == 1
    assert len(status_reads) == 2  # the new watcher polled before serving


class _Remote:
    def __init__(self, value) -> None:
        self.value = value

    def remote(self):
        async def answer():
            if isinstance(self.value, BaseException):
                raise self.value
            return self.value

        return answer()


class _Replica:
    def __init__(self, info) -> None:
        self.info = _Remote(info)


def test_a_view_reads_one_replica_of_each_available_pool_and_leaves_out_a_failed_read():
    watch = PoolWatch({"hot": _Replica("hot info"), "cold": _Replica("cold info")}, "f", "app")

    async def views() -> tuple[dict, dict]:
        watch._first_poll = watch._watcher = asyncio.get_running_loop().create_future()
        watch._first_poll.set_result(None)  # already watching: no serve.status() here
        first = (await watch.view()).infos  # cold: not available
        watch.available["cold"] = True
        watch.handles["hot"] = _Replica(RuntimeError("replica gone"))
        return first, (await watch.view()).infos

    assert asyncio.run(views()) == ({"hot": "hot info"}, {"cold": "cold info"})


def test_a_pool_announced_to_go_to_zero_is_left_at_once_and_hot_never_is():
    watch = _watch()
    watch.available["cold"] = True
    watch.set_target("cold", 0)
    assert watch.available["cold"] is False and watch.emptying == {"cold"}
    watch.set_target("hot", 0)
    assert watch.available["hot"] is True
    watch.set_target("cold", 2)  # the watcher marks it available once a replica runs
    assert watch.emptying == set() and watch.available["cold"] is False
