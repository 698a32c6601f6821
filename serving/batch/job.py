"""One batch in memory: its record, its lines, what is done, pending and in flight.

Rebuilt from the store after a restart: the input file gives the lines, the journal the answered
ones; everything else is pending again (a request that was in flight when the app died was never
recorded, so it runs again, and only its one recorded answer reaches the output file).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from serving.batch import jobs
from serving.batch.store import BatchStore


@dataclass
class Job:
    record: dict  # {"batch": OpenAI Batch dict, "lane": tideserve's numbers}
    lines: dict[int, jobs.BatchLine]
    done: dict[int, dict]
    pending: deque[int] = field(default_factory=deque)
    in_flight: dict[int, asyncio.Task] = field(default_factory=dict)

    @property
    def batch(self) -> dict:
        return self.record["batch"]

    @property
    def lane(self) -> dict:
        return self.record["lane"]

    @classmethod
    def restore(cls, record: dict, store: BatchStore, max_lines: int) -> Job:
        batch = record["batch"]
        lines: dict[int, jobs.BatchLine] = {}
        if batch["status"] in jobs.OPEN:
            parsed, _ = jobs.parse_input(
                store.file_content(batch["input_file_id"]), batch["endpoint"], max_lines
            )
            lines = {line.index: line for line in parsed}
        done = store.read_results(batch["id"])
        job = cls(record, lines, done)
        if batch["status"] == "in_progress":  # cancelling / finalizing only finish what is done
            job.pending.extend(i for i in sorted(lines) if i not in done)
        job.refresh_counts()
        return job

    def refresh_counts(self) -> None:
        ok = sum(1 for e in self.done.values() if jobs.is_success(e))
        total = len(self.lines) or self.batch["request_counts"]["total"]
        self.batch["request_counts"] = {
            "total": total,
            "completed": ok,
            "failed": len(self.done) - ok,
        }
        if self.lines:
            self.batch["usage"] = jobs.usage_of(self.done.values())

    def record_answer(self, store: BatchStore, entry: dict, now_s: float) -> None:
        """Journal first (fsync'd), then count: an answer is only ever counted once on disk."""
        index = entry["index"]
        if index in self.done:  # cannot happen: a line is pending or in flight, never both
            return
        store.append_result(self.batch["id"], entry)
        self.done[index] = entry
        self.refresh_counts()

    def finished(self) -> bool:
        return not self.pending and not self.in_flight

    def view(self, now_s: float, wall_s: float) -> dict:
        """The Batch object with tideserve's progress numbers under `tideserve`."""
        counts = self.batch["request_counts"]
        done = counts["completed"] + counts["failed"]
        usage = self.batch.get("usage") or {}
        # Set by the lane's outlook (serving/batch/outlook.py): the forecast's valleys, not pace.
        estimate = self.lane.get("estimate") or {}
        open_ = self.batch["status"] == "in_progress"
        eta = estimate.get("completion_at") if open_ else None
        extra = {
            "progress": done / counts["total"] if counts["total"] else 1.0,
            "in_flight": len(self.in_flight),
            "tokens_done": usage.get("total_tokens", 0),
            "idle_capacity_used_replica_s": round(self.lane.get("replica_s", 0.0), 3),
            "estimated_completion_at": None if eta is None else round(eta, 1),
            "estimate_basis": estimate.get("basis", "") if open_ else "",
            "lane_reason": self.lane.get("reason", ""),
        }
        return {**self.batch, "tideserve": extra}
