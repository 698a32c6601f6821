"""/v1/files and /v1/batches as OpenAI defines them, on the offline lane (serving/batch/lane.py).

BatchApi answers the Batch API's HTTP requests; the ingress deployment
(serving/routes/ingress.py) declares the routes and hands each request to it. One ingress per
app, so one lane and one store.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import Response

from serving.api.errors import ApiError
from serving.api.http import check_api_key, read_json
from serving.batch import jobs
from serving.batch.lane import OfflineLane
from serving.batch.runner import file_object
from serving.batch.store import new_file_id
from serving.routes.upload import MULTIPART_OVERHEAD_BYTES, parse_form, read_capped

CREATE_FIELDS = ("input_file_id", "endpoint", "completion_window", "metadata")
NOT_IMPLEMENTED = ("output_expires_after",)


def _limit(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= 10000:
        raise ApiError(
            400, f"limit={raw!r} is out of range; allowed: 1 <= limit <= 10000", param="limit"
        )
    return int(raw)


def _page(items: list[dict], request: Request) -> dict:
    after = request.query_params.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = _limit(request)
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _file_or_404(store, file_id: str) -> dict:
    try:
        return store.get_file(file_id)
    except KeyError:
        raise ApiError(
            404, f"file {file_id!r} does not exist", param="file_id", code="file_not_found"
        ) from None


class BatchApi:
    def __init__(self, lane: OfflineLane, api_key: str | None, max_body_bytes: int) -> None:
        self.lane, self.api_key, self.max_body_bytes = lane, api_key, max_body_bytes
        self.runner = lane.runner

    async def upload_file(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        cap = self.lane.cfg.max_file_bytes
        body = await read_capped(request, cap + MULTIPART_OVERHEAD_BYTES, "upload")
        form = parse_form(request.headers.get("content-type", ""), body)
        unknown = sorted(set(form) - {"file", "purpose"})
        if unknown:
            why = "is not implemented" if unknown[0] == "expires_after" else "is not a known field"
            raise ApiError(400, f"{unknown[0]} {why}; fields: file, purpose", param=unknown[0])
        purpose = form.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        if purpose != "batch":
            raise ApiError(
                400, f"purpose={purpose!r} is not supported; allowed: ['batch']", param="purpose"
            )
        if "file" not in form:
            raise ApiError(400, "file is required", param="file")
        filename, data = form["file"]
        if len(data) > cap:
            raise ApiError(
                413,
                f"file of {len(data)} bytes exceeds batch_api.max_file_bytes={cap}",
                param="file",
                code="file_too_large",
            )
        meta = file_object(
            new_file_id(), filename or "upload.jsonl", "batch", len(data), int(time.time())
        )
        return await asyncio.to_thread(self.lane.store.put_file, meta, data)

    async def list_files(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        files = await asyncio.to_thread(self.lane.store.list_files)
        purpose = request.query_params.get("purpose")
        files = [f for f in files if purpose is None or f["purpose"] == purpose]
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, f"order={order!r}; allowed: ['asc', 'desc']", param="order")
        files.sort(key=lambda f: (f["created_at"], f["id"]), reverse=order == "desc")
        return _page(files, request)

    async def retrieve_file(self, file_id: str, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return _file_or_404(self.lane.store, file_id)

    async def file_content(self, file_id: str, request: Request) -> Response:
        check_api_key(self.api_key, request)
        _file_or_404(self.lane.store, file_id)
        data = await asyncio.to_thread(self.lane.store.file_content, file_id)
        return Response(data, media_type="application/octet-stream")

    async def delete_file(self, file_id: str, request: Request) -> dict:
        check_api_key(self.api_key, request)
        _file_or_404(self.lane.store, file_id)
        for job in self.runner.jobs.values():
            if job.batch["input_file_id"] == file_id and job.batch["status"] in jobs.OPEN:
                raise ApiError(
                    409,
                    f"file {file_id!r} is the input of batch {job.batch['id']} "
                    f"({job.batch['status']}); cancel it first",
                    param="file_id",
                    code="file_in_use",
                )
        await asyncio.to_thread(self.lane.store.delete_file, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def create_batch(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        body = await read_json(request, self.max_body_bytes)
        for key in body:
            if key in NOT_IMPLEMENTED:
                raise ApiError(400, f"{key} is not implemented", param=key)
            if key not in CREATE_FIELDS:
                raise ApiError(400, f"{key}: unknown field", param=key)
        for key in CREATE_FIELDS[:3]:
            if key not in body:
                raise ApiError(400, f"{key} is required", param=key)
        self.lane.ensure_running()
        # Reading and checking a large input file must not stall the ingress's event loop; the
        # lane sees the job once it is registered, back on the loop.
        job = await asyncio.to_thread(
            self.runner.build,
            body["input_file_id"],
            body["endpoint"],
            body["completion_window"],
            body.get("metadata"),
        )
        return self.runner.register(job)

    async def list_batches(self, request: Request) -> dict:
        check_api_key(self.api_key, request)
        now, wall = time.monotonic(), time.time()
        views = [job.view(now, wall) for job in self.runner.jobs.values()]
        views.sort(key=lambda b: (b["created_at"], b["id"]), reverse=True)  # newest first
        return {**_page(views, request), "tideserve": self.lane.summary()}

    async def retrieve_batch(self, batch_id: str, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return self.runner.get(batch_id).view(time.monotonic(), time.time())

    async def cancel_batch(self, batch_id: str, request: Request) -> dict:
        check_api_key(self.api_key, request)
        return self.runner.cancel(batch_id)
