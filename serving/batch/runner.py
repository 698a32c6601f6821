"""BatchRunner: the offline lane's loop inside the ingress, and the API's batch operations.

Every `poll_interval_s` it observes the replicas (`observe`, a coroutine the ingress supplies),
asks scheduler.decide_lane how many batch requests may be in flight, cancels the ones live
traffic needs back, and starts pending lines (earliest deadline first) in the offline tier via
`execute` (the ingress's own request path: the same validation, tiers and replicas as HTTP).
Between two decisions, a batch request that ends is replaced at once within the last decision's
room (when it let new requests start), so short requests do not leave slots idle for a poll.
A refusal (429/503) puts a line back and backs the lane off; any other 4xx is the line's answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from serving.api.errors import ApiError
from serving.batch import jobs
from serving.batch.job import Job
from serving.batch.scheduler import LaneDecision, LaneView, decide_lane
from serving.batch.store import BatchStore, new_batch_id, new_file_id
from serving.config.batch_api import BatchApiSection

log = logging.getLogger("ray.serve")
Execute = Callable[[str, dict], Awaitable[dict]]  # (url, body) -> response body; ApiError on 4xx
Observe = Callable[[float, int], Awaitable[LaneView]]  # (now_s, batch_in_flight) -> view
REFUSED = (429, 503)  # capacity answers: the line goes back to pending
SAVE_EVERY_S = 5.0


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        cfg: BatchApiSection,
        execute: Execute,
        observe: Observe,
        endpoints: tuple[str, ...],
        model: str,
    ) -> None:
        self.store, self.cfg, self.execute, self.observe = store, cfg, execute, observe
        self.endpoints, self.model = endpoints, model
        self.jobs: dict[str, Job] = {}
        self.last_refusal_s: float | None = None
        self.last: LaneDecision | None = None
        self.last_view: LaneView | None = None
        self.replica_s_total = 0.0  # idle replica-seconds the lane used, all batches
        self._last_save_s = 0.0
        for record in store.load_batches():
            job = Job.restore(record, store, cfg.max_requests_per_batch)
            self.jobs[job.batch["id"]] = job

    # ----- API operations --------------------------------------------------------------------
    def create(self, input_file_id: str, endpoint: str, window: str, metadata: dict | None) -> dict:
        return self.register(self.build(input_file_id, endpoint, window, metadata))

    def register(self, job: Job) -> dict:
        """On the event loop: the lane iterates `jobs` there."""
        self.jobs[job.batch["id"]] = job
        return job.view(time.monotonic(), time.time())

    def build(self, input_file_id: str, endpoint: str, window: str, metadata: dict | None) -> Job:
        """Check the request and the input file, store the record (safe in a worker thread)."""
        endpoint = jobs.check_endpoint(endpoint, self.endpoints)
        window_s = jobs.window_seconds(window, self.cfg.max_completion_window_s)
        metadata = jobs.check_metadata(metadata)
        meta = self._input_file(input_file_id)
        now = int(time.time())
        batch = jobs.new_batch(
            new_batch_id(), endpoint, meta["id"], window, window_s, metadata, self.model, now
        )
        data = self.store.file_content(meta["id"])
        lines, errors = jobs.parse_input(data, endpoint, self.cfg.max_requests_per_batch)
        if errors:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
        else:
            batch.update(status="in_progress", in_progress_at=now)
        job = Job(
            {"batch": batch, "lane": {"replica_s": 0.0, "reason": ""}},
            {line.index: line for line in lines},
            {},
        )
        job.pending.extend(sorted(job.lines))
        job.refresh_counts()
        self.store.save_batch(job.record)
        return job

    def _input_file(self, file_id: object) -> dict:
        try:
            meta = self.store.get_file(file_id) if isinstance(file_id, str) else None
        except KeyError:
            meta = None
        if meta is None:
            raise ApiError(
                404,
                f"input_file_id={file_id!r}: no such file",
                param="input_file_id",
                code="file_not_found",
            )
        if meta["purpose"] != "batch":
            raise ApiError(
                400,
                f"input_file_id={file_id!r} has purpose {meta['purpose']!r}; "
                "a batch reads files uploaded with purpose 'batch'",
                param="input_file_id",
            )
        return meta

    def get(self, batch_id: str) -> Job:
        job = self.jobs.get(batch_id)
        if job is None:
            raise ApiError(
                404, f"batch {batch_id!r} does not exist", param="batch_id", code="batch_not_found"
            )
        return job

    def cancel(self, batch_id: str) -> dict:
        job = self.get(batch_id)
        if job.batch["status"] in ("validating", "in_progress"):
            job.batch.update(status="cancelling", cancelling_at=int(time.time()))
            job.pending.clear()
            for task in job.in_flight.values():
                task.cancel()
            self.store.save_batch(job.record)
        return job.view(time.monotonic(), time.time())

    # ----- the loop ------------------------------------------------------------------------------
    async def run(self, every_tick: Callable[[], None] | None = None) -> None:
        """`every_tick`: the ingress's own per-tick work (the lane's forecast), batches or not."""
        while True:
            try:
                if every_tick is not None:
                    every_tick()
                await self.tick(time.monotonic())
            except Exception:  # a failed poll must not end the lane; the next tick retries
                log.exception("batch lane tick failed")
            await asyncio.sleep(self.cfg.poll_interval_s)

    def _open_jobs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.batch["status"] in jobs.OPEN]

    async def tick(self, now_s: float) -> LaneDecision | None:
        for job in self._open_jobs():
            self._expire_or_finalize(job)
        open_jobs = [j for j in self._open_jobs() if j.batch["status"] == "in_progress"]
        if not open_jobs:
            return None
        in_flight = sum(len(j.in_flight) for j in open_jobs)
        view = await self.observe(now_s, in_flight)
        cfg = self.cfg
        decision = decide_lane(view, cfg.slot_share, cfg.max_in_flight, cfg.refusal_backoff_s)
        self.last, self.last_view = decision, view
        if decision.num_to_cancel:
            self._yield(open_jobs, decision.num_to_cancel)
        self._launch(open_jobs, decision.max_in_flight - in_flight + decision.num_to_cancel)
        for job in open_jobs:
            job.lane["reason"] = decision.reason
        if now_s - self._last_save_s >= SAVE_EVERY_S:
            self._last_save_s = now_s
            for job in open_jobs:
                self.store.save_batch(job.record)
        return decision

    def _account(self, job: Job, started_s: float) -> None:
        """Idle capacity used, in replica-seconds: a batch request holds 1 / slots of a replica
        (the lower-tier request slots the scheduler shares out) for as long as it runs."""
        slots = self.last_view.slots_per_replica if self.last_view else 1
        used = (time.monotonic() - started_s) / max(slots, 1)
        job.lane["replica_s"] = job.lane.get("replica_s", 0.0) + used
        self.replica_s_total += used

    def _yield(self, open_jobs: list[Job], count: int) -> None:
        """Cancel the newest batch requests (least done, least lost); their lines go back."""
        tasks = [(t.get_name(), t) for j in open_jobs for t in j.in_flight.values()]
        for _, task in sorted(tasks, key=lambda x: x[0], reverse=True)[:count]:
            task.cancel()

    def _launch(self, open_jobs: list[Job], count: int) -> None:
        by_deadline = sorted(open_jobs, key=lambda j: j.batch["expires_at"])
        for job in by_deadline:
            while count > 0 and job.pending:
                index = job.pending.popleft()
                task = asyncio.get_running_loop().create_task(
                    self._run_line(job, job.lines[index]), name=f"{time.monotonic_ns():020d}"
                )
                job.in_flight[index] = task
                count -= 1

    async def _run_line(self, job: Job, line: jobs.BatchLine) -> None:
        started_s = time.monotonic()
        answered = False
        try:
            answered = await self._answer_line(job, line)
        finally:
            self._account(job, started_s)
        if answered:  # not after a cancel (the slot went to live traffic) nor a refusal
            self._refill()

    def _refill(self) -> None:
        """A batch request ended: start the next one now, within the last decision's room, if
        that decision let new ones start and no replica refused offline work since."""
        decision, now = self.last, time.monotonic()
        if decision is None or not decision.may_start:
            return
        since = None if self.last_refusal_s is None else now - self.last_refusal_s
        if since is not None and since < self.cfg.refusal_backoff_s:
            return
        open_jobs = [j for j in self._open_jobs() if j.batch["status"] == "in_progress"]
        in_flight = sum(len(j.in_flight) for j in open_jobs)
        self._launch(open_jobs, decision.max_in_flight - in_flight)

    async def _answer_line(self, job: Job, line: jobs.BatchLine) -> bool:
        """True: the line has its answer; False: it went back to pending."""
        try:
            body = await self.execute(job.batch["endpoint"], line.body)
            entry = jobs.result_entry(line, 200, body)
        except asyncio.CancelledError:
            job.in_flight.pop(line.index, None)
            if job.batch["status"] == "in_progress":
                job.pending.appendleft(line.index)
            raise
        except ApiError as err:
            if err.status in REFUSED:
                self._requeue(job, line, f"{err.status}: {err.message}")
                return False
            entry = jobs.result_entry(line, err.status, err.body())
        except Exception as err:  # a replica died mid-generation: not the request's fault
            self._requeue(job, line, type(err).__name__)
            return False
        # No await from here: a cancel cannot land between the journal write and the count.
        job.in_flight.pop(line.index, None)
        job.record_answer(self.store, entry, time.monotonic())
        return True

    def _requeue(self, job: Job, line: jobs.BatchLine, why: str) -> None:
        job.in_flight.pop(line.index, None)
        self.last_refusal_s = time.monotonic()
        if job.batch["status"] == "in_progress":
            job.pending.appendleft(line.index)
        log.debug("batch %s line %d refused (%s)", job.batch["id"], line.index, why)

    # ----- endings -------------------------------------------------------------------------------
    def _expire_or_finalize(self, job: Job) -> None:
        status, now = job.batch["status"], int(time.time())
        if status == "in_progress" and now >= job.batch["expires_at"] and not job.finished():
            job.pending.clear()
            for task in job.in_flight.values():
                task.cancel()
            job.lane["final"] = "expired"  # unfinished lines get batch_expired errors
            job.batch.update(status="finalizing", finalizing_at=now)
        if job.in_flight:
            return
        status = job.batch["status"]
        if status in ("cancelling", "finalizing") or job.finished():
            self._finalize(job, now)

    def _finalize(self, job: Job, now: int) -> None:
        """Write the output and error files; a restart mid-way redoes this from the journal."""
        final = "cancelled" if job.batch["status"] == "cancelling" else "completed"
        final = job.lane.get("final") or final
        job.lane["final"] = final
        if final == "expired":
            for index in sorted(set(job.lines) - set(job.done)):
                entry = jobs.expired_entry(job.lines[index])
                job.record_answer(self.store, entry, time.monotonic())
        job.batch.update(status="finalizing", finalizing_at=job.batch["finalizing_at"] or now)
        self.store.save_batch(job.record)
        output, errors = jobs.output_files(list(job.done.values()))
        name = job.batch["id"]
        job.batch["output_file_id"] = self._output_file(f"{name}_output.jsonl", output)
        job.batch["error_file_id"] = self._output_file(f"{name}_error.jsonl", errors)
        job.refresh_counts()
        job.batch.update(status=final, **{f"{final}_at": now})
        self.store.save_batch(job.record)

    def _output_file(self, filename: str, data: bytes) -> str | None:
        if not data:
            return None
        meta = file_object(new_file_id(), filename, "batch_output", len(data), int(time.time()))
        self.store.put_file(meta, data)
        return meta["id"]


def file_object(file_id: str, filename: str, purpose: str, num_bytes: int, now: int) -> dict:
    return {
        "id": file_id,
        "object": "file",
        "bytes": num_bytes,
        "created_at": now,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
