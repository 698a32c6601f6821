"""The ingress's pool watcher (serving/llm/ingress.py): one per ingress, however many requests
arrive at once while it starts. Each poll reads serve.status(), tens of ms of CPU; a watcher per
request of the first burst burned half a core of a 2-core machine at idle."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serving.llm import ingress as ingress_mod
from serving.llm.ingress import Ingress


def _bare_ingress() -> Ingress:
    ing = Ingress.__new__(Ingress)  # no model, no Ray: only what the watcher reads
    ing.handles = {"hot": object(), "cold": object()}
    ing.available = {"hot": True, "cold": False}
    ing.emptying, ing.verified, ing.app_name = set(), {}, "tideserve"
    ing._watcher = ing._first_poll = None
    return ing


@pytest.fixture
def status_reads(monkeypatch):
    """serve.status() stand-in: counts its calls; slow enough that a burst arrives during one."""
    calls, lock = [], threading.Lock()

    def running_replicas(app_name: str) -> dict[str, int]:
        with lock:
            calls.append(app_name)
        threading.Event().wait(0.05)
        return {"hot": 1, "cold": 0}

    monkeypatch.setattr(ingress_mod, "running_replicas", running_replicas)
    return calls


def _watchers() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_watch_pools"]


def test_a_burst_of_first_requests_shares_one_poll_and_one_watcher(status_reads):
    ing = _bare_ingress()

    async def burst() -> int:
        await asyncio.gather(*(ing.ensure_watching() for _ in range(16)))
        num_watchers = len(_watchers())
        ing._watcher.cancel()
        return num_watchers

    assert asyncio.run(burst()) == 1
    assert status_reads == ["tideserve"]  # one poll answered all 16
    assert ing.available == {"hot": True, "cold": False}


def test_a_request_that_leaves_during_the_first_poll_does_not_cancel_it(status_reads):
    ing = _bare_ingress()

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
    ing = _bare_ingress()

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
