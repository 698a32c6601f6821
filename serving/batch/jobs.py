"""Pure pieces of a batch: its input lines, its OpenAI `Batch` object, its output records.

Statuses follow OpenAI: validating -> in_progress -> finalizing -> completed, or failed (the
input file is invalid), expired (the completion window passed; unfinished lines go to the error
file with code batch_expired), cancelling -> cancelled. Times are epoch seconds, passed in.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from serving.api.errors import ApiError

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
# What a generate app runs; /v1/embeddings lines belong to an embedding app (model.task: embed).
GENERATE_ENDPOINTS = (CHAT, COMPLETIONS)
OPENAI_ENDPOINTS = ("/v1/responses", CHAT, EMBEDDINGS, COMPLETIONS, "/v1/moderations")
OPEN = ("validating", "in_progress", "finalizing", "cancelling")  # the lane still owes work
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


@dataclass(frozen=True, slots=True)
class BatchLine:
    index: int  # 0-based line of the input file (OpenAI's error `line` is 1-based)
    custom_id: str
    body: dict


def window_seconds(window: object, max_window_s: float) -> float:
    """'24h' (OpenAI's value) or any '<n>s'/'<n>m'/'<n>h' up to
    batch_api.max_completion_window_s."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    seconds = int(match[1]) * _UNIT_S[match[2]] if match else None
    if seconds is None or seconds > max_window_s:
        raise ApiError(
            400,
            f"completion_window={window!r} is not allowed; allowed: '24h' or '<n>s'/'<n>m'/'<n>h' "
            f"up to {max_window_s:g} s (batch_api.max_completion_window_s)",
            param="completion_window",
        )
    return float(seconds)


def check_endpoint(endpoint: object, supported: tuple[str, ...]) -> str:
    if endpoint in supported:
        return endpoint
    why = "" if endpoint not in OPENAI_ENDPOINTS else " by this app"
    if endpoint == EMBEDDINGS:
        why = " by a generate app (model.task: generate); embeddings need an embedding model"
    raise ApiError(
        400,
        f"endpoint={endpoint!r} is not supported{why}; supported: {list(supported)}",
        param="endpoint",
    )


def check_metadata(metadata: object) -> dict | None:
    if metadata is None:
        return None
    ok = isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_PAIRS
    ok = ok and all(
        isinstance(k, str)
        and isinstance(v, str)
        and len(k) <= MAX_METADATA_KEY
        and len(v) <= MAX_METADATA_VALUE
        for k, v in metadata.items()
    )
    if not ok:
        raise ApiError(
            400,
            f"metadata must map at most {MAX_METADATA_PAIRS} string keys (<= {MAX_METADATA_KEY} "
            f"chars) to string values (<= {MAX_METADATA_VALUE} chars)",
            param="metadata",
        )
    return dict(metadata)


def _line_error(index: int, message: str, param: str | None = None) -> dict:
    return {"code": "invalid_request", "line": index + 1, "message": message, "param": param}


def _parse_line(index: int, raw: bytes, endpoint: str, seen: set[str]) -> BatchLine | dict:
    try:
        item = json.loads(raw)
    except ValueError as err:
        return _line_error(index, f"not valid JSON: {err}")
    if not isinstance(item, dict):
        return _line_error(index, "each line must be a JSON object")
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        return _line_error(index, f"unknown field {unknown[0]!r}", unknown[0])
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _line_error(index, "custom_id must be a non-empty string", "custom_id")
    if custom_id in seen:
        return _line_error(index, f"custom_id {custom_id!r} is not unique", "custom_id")
    if item.get("method") != "POST":
        return _line_error(index, f"method={item.get('method')!r}; only 'POST'", "method")
    if item.get("url") != endpoint:
        return _line_error(
            index, f"url={item.get('url')!r} differs from the batch's endpoint {endpoint!r}", "url"
        )
    if not isinstance(item.get("body"), dict):
        return _line_error(index, "body must be a JSON object", "body")
    if item["body"].get("stream"):
        return _line_error(index, "body.stream=true is not allowed in a batch", "body.stream")
    seen.add(custom_id)
    return BatchLine(index, custom_id, item["body"])


def parse_input(data: bytes, endpoint: str, max_lines: int) -> tuple[list[BatchLine], list[dict]]:
    """The lines of an input file, or the errors that fail the batch (OpenAI's `errors.data`)."""
    raw_lines = [line for line in data.splitlines() if line.strip()]
    if not raw_lines:
        return [], [_line_error(0, "the input file has no request lines") | {"line": None}]
    if len(raw_lines) > max_lines:
        message = f"{len(raw_lines)} lines; at most {max_lines} (batch_api.max_requests_per_batch)"
        return [], [_line_error(max_lines, message) | {"code": "too_many_requests"}]
    lines, errors, seen = [], [], set()
    for index, raw in enumerate(raw_lines):
        parsed = _parse_line(index, raw, endpoint, seen)
        (lines if isinstance(parsed, BatchLine) else errors).append(parsed)
    return lines, errors


def new_batch(
    batch_id: str,
    endpoint: str,
    input_file_id: str,
    window: str,
    window_s: float,
    metadata: dict | None,
    model: str,
    now: int,
) -> dict:
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + int(window_s),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata,
        "model": model,
        "usage": usage_of([]),
    }


def usage_of(entries) -> dict:
    """OpenAI's BatchUsage summed over the answered lines' usage."""
    tin = tout = 0
    for entry in entries:
        u = ((entry.get("response") or {}).get("body") or {}).get("usage") or {}
        tin += int(u.get("prompt_tokens", 0))
        tout += int(u.get("completion_tokens", 0))
    return {
        "input_tokens": tin,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tout,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tin + tout,
    }


def result_entry(line: BatchLine, status_code: int, body: dict) -> dict:
    """The journal entry and output-file line of one answered request (OpenAI's batch output
    format, plus `index`, the input line it answers)."""
    return {
        "id": "batch_req_" + uuid.uuid4().hex[:24],
        "custom_id": line.custom_id,
        "response": {
            "status_code": status_code,
            "request_id": f"req_{uuid.uuid4().hex[:24]}",
            "body": body,
        },
        "error": None,
        "index": line.index,
    }


def expired_entry(line: BatchLine) -> dict:
    return {
        "id": "batch_req_" + uuid.uuid4().hex[:24],
        "custom_id": line.custom_id,
        "response": None,
        "error": {
            "code": "batch_expired",
            "message": "the request was not run before the batch expired",
        },
        "index": line.index,
    }


def is_success(entry: dict) -> bool:
    return entry["response"] is not None and entry["response"]["status_code"] == 200


def output_files(entries: list[dict]) -> tuple[bytes, bytes]:
    """(output, errors) JSONL in input order; `index` is the journal's, not OpenAI's."""
    out, err = [], []
    for entry in sorted(entries, key=lambda e: e["index"]):
        public = {k: v for k, v in entry.items() if k != "index"}
        (out if is_success(entry) else err).append(json.dumps(public) + "\n")
    return "".join(out).encode(), "".join(err).encode()
