"""BatchRunner without Serve: a fake request path, the real store, ticks driven by the test.

Covers resume after a crash (every line answered exactly once), yielding to live traffic,
refusals, per-line errors, cancel and expiry; the runner's ticks get `now` from the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from serving.api.errors import ApiError
from serving.batch.runner import BatchRunner, file_object
from serving.batch.scheduler import LaneView
from serving.batch.store import BatchStore
from serving.config.batch_api import BatchApiSection
from tests.unit.batch.test_scheduler import IDLE

CHAT = "/v1/chat/completions"


def upload(store: BatchStore, n: int) -> str:
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": {"messages": [], "i": i}}
        for i in range(n)
    ]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    meta = file_object("file-in" + str(n), "in.jsonl", "batch", len(data), 0)
    store.put_file(meta, data)
    return meta["id"]


class FakePath:
    """The ingress's request path: answers with usage; lines in `hold` wait for `release`."""

    def __init__(self, view: LaneView = IDLE) -> None:
        self.calls: list[int] = []
        self.hold: set[int] = set()
        self.release = asyncio.Event()
        self.refuse_once: set[int] = set()
        self.bad: set[int] = set()
        self.view = view

    async def execute(self, url: str, body: dict) -> dict:
        i = body["i"]
        self.calls.append(i)
        if i in self.refuse_once:
            self.refuse_once.discard(i)
            raise ApiError(429, "no idle KV headroom", retry_after_s=1)
        if i in self.bad:
            raise ApiError(400, "max_tokens out of range", param="max_tokens")
        if i in self.hold:
            await self.release.wait()
        return {"object": "chat.completion", "i": i,
                "usage": {"prompt_tokens": 3, "completion_tokens": 2}}  # fmt: skip

    async def observe(self, now_s: float, batch_in_flight: int) -> LaneView:
        return dataclasses.replace(self.view, now_s=now_s, batch_in_flight=batch_in_flight)


def runner_for(store, path, **cfg) -> BatchRunner:
    cfg = BatchApiSection(**{"max_in_flight": 4, "refusal_backoff_s": 0.0, **cfg})
    return BatchRunner(store, cfg, path.execute, path.observe, (CHAT,), "tiny")


async def settle(runner: BatchRunner, now: float, ticks: int = 50) -> float:
    for _ in range(ticks):
        await runner.tick(now)
        for _ in range(5):
            await asyncio.sleep(0)  # let the line tasks run; no wall-clock sleep
        now += 1.0
        if not runner._open_jobs():
            break
    return now


def output_ids(store: BatchStore, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    return [json.loads(x)["custom_id"] for x in store.file_content(file_id).splitlines()]


def test_a_batch_completes_with_every_line_once(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        runner = runner_for(store, path)
        batch = runner.create(upload(store, 10), CHAT, "24h", {"k": "v"})
        assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 10
        await settle(runner, 0.0)
        done = runner.get(batch["id"]).view(0.0, 0.0)
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 10
        assert output_ids(store, done["output_file_id"]) == [f"r{i}" for i in range(10)]
        assert done["error_file_id"] is None and done["usage"]["total_tokens"] == 50
        assert done["tideserve"]["progress"] == 1.0 and done["tideserve"]["tokens_done"] == 50

    asyncio.run(go())


def test_an_ended_request_is_replaced_at_once_within_the_decisions_room(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        runner = runner_for(store, path)  # max_in_flight 4
        batch_id = runner.create(upload(store, 10), CHAT, "24h", None)["id"]
        await runner.tick(0.0)  # ONE decision: room for 4
        for _ in range(40):
            await asyncio.sleep(0)
            assert len(runner.get(batch_id).in_flight) <= 4
        assert len(runner.get(batch_id).done) == 10  # refilled without waiting for a tick

    asyncio.run(go())


def test_no_refill_after_a_refusal_or_when_the_decision_lets_none_start(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.refuse_once = {0}
        runner = runner_for(store, path, refusal_backoff_s=5.0)
        batch_id = runner.create(upload(store, 10), CHAT, "24h", None)["id"]
        await runner.tick(0.0)
        for _ in range(40):
            await asyncio.sleep(0)
        # line 0 was refused: the refill stops for the backoff; lines 1-3 of the first launch
        # were answered before it, the rest waits for a decision
        assert len(runner.get(batch_id).done) < 10
        assert 0 in runner.get(batch_id).pending

    asyncio.run(go())


def test_restart_mid_batch_resumes_and_answers_each_line_once(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.hold = {5, 6, 7, 8, 9}
        runner = runner_for(store, path)
        bid = runner.create(upload(store, 10), CHAT, "24h", None)["id"]
        await settle(runner, 0.0, ticks=6)
        assert len(store.read_results(bid)) == 5  # 5 answered, the rest in flight
        for job in runner.jobs.values():  # the app dies: in-flight work is lost, never recorded
            for task in job.in_flight.values():
                task.cancel()
        await asyncio.sleep(0)
        fresh_path = FakePath()
        fresh = runner_for(BatchStore(tmp_path), fresh_path)  # the restarted app
        assert sorted(fresh.jobs[bid].pending) == [5, 6, 7, 8, 9]
        await settle(fresh, 100.0)
        assert sorted(fresh_path.calls) == [5, 6, 7, 8, 9]  # answered lines never run again
        batch = fresh.get(bid).batch
        assert batch["status"] == "completed"
        assert output_ids(fresh.store, batch["output_file_id"]) == [f"r{i}" for i in range(10)]

    asyncio.run(go())


def test_live_traffic_makes_the_lane_yield_and_the_lines_return(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.hold = set(range(8))
        runner = runner_for(store, path)
        bid = runner.create(upload(store, 8), CHAT, "24h", None)["id"]
        await settle(runner, 0.0, ticks=2)
        job = runner.get(bid)
        assert len(job.in_flight) == 4
        path.view = dataclasses.replace(IDLE, live_in_flight=15)  # room for 0 batch requests
        decision = await runner.tick(10.0)
        await asyncio.sleep(0)
        assert decision.num_to_cancel == 4 and not job.in_flight and len(job.pending) == 8
        path.view, path.hold = IDLE, set()
        path.release.set()
        await settle(runner, 20.0)
        assert output_ids(store, job.batch["output_file_id"]) == [f"r{i}" for i in range(8)]

    asyncio.run(go())


def test_refusals_requeue_and_request_errors_are_answers(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.refuse_once, path.bad = {1}, {2}
        runner = runner_for(store, path)
        bid = runner.create(upload(store, 4), CHAT, "24h", None)["id"]
        await settle(runner, 0.0)
        batch = runner.get(bid).batch
        assert runner.last_refusal_s is not None and path.calls.count(1) == 2
        assert batch["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        assert output_ids(store, batch["output_file_id"]) == ["r0", "r1", "r3"]
        (err,) = store.file_content(batch["error_file_id"]).splitlines()
        err = json.loads(err)
        assert err["custom_id"] == "r2" and err["response"]["status_code"] == 400
        assert err["response"]["body"]["error"]["param"] == "max_tokens"

    asyncio.run(go())


def test_cancel_keeps_what_is_done(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.hold = set(range(2, 10))
        runner = runner_for(store, path, max_in_flight=4)
        bid = runner.create(upload(store, 10), CHAT, "24h", None)["id"]
        await settle(runner, 0.0, ticks=3)
        assert runner.cancel(bid)["status"] == "cancelling"
        await settle(runner, 10.0)
        batch = runner.get(bid).batch
        assert batch["status"] == "cancelled" and batch["cancelled_at"] is not None
        assert output_ids(store, batch["output_file_id"]) == ["r0", "r1"]

    asyncio.run(go())


def test_expiry_reports_unrun_lines_as_batch_expired(tmp_path):
    async def go():
        store, path = BatchStore(tmp_path), FakePath()
        path.hold = set(range(1, 3))
        runner = runner_for(store, path, max_in_flight=1)
        bid = runner.create(upload(store, 3), CHAT, "1s", None)["id"]
        await settle(runner, 0.0, ticks=2)
        runner.get(bid).batch["expires_at"] = 0  # the window has passed
        await settle(runner, 10.0)
        batch = runner.get(bid).batch
        assert batch["status"] == "expired" and batch["expired_at"] is not None
        errors = [json.loads(x) for x in store.file_content(batch["error_file_id"]).splitlines()]
        assert [e["custom_id"] for e in errors] == ["r1", "r2"]
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}

    asyncio.run(go())


def test_invalid_input_fails_the_batch_with_line_errors(tmp_path):
    store, path = BatchStore(tmp_path), FakePath()
    data = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    store.put_file(file_object("file-bad", "b.jsonl", "batch", len(data), 0), data)
    batch = runner_for(store, path).create("file-bad", CHAT, "24h", None)
    assert batch["status"] == "failed" and batch["errors"]["data"][0]["param"] == "url"


def test_create_refuses_unknown_file_and_wrong_purpose(tmp_path):
    store, path = BatchStore(tmp_path), FakePath()
    runner = runner_for(store, path)
    for file_id, status in (("file-nope", 404), (None, 404)):
        try:
            runner.create(file_id, CHAT, "24h", None)
        except ApiError as err:
            assert err.status == status and err.param == "input_file_id"
        else:
            raise AssertionError("no error")
    store.put_file(file_object("file-out", "o.jsonl", "batch_output", 1, 0), b"x")
    try:
        runner.create("file-out", CHAT, "24h", None)
    except ApiError as err:
        assert err.status == 400 and "purpose" in err.message
