"""The Batch API over real Serve HTTP, driven by the openai SDK and checked with its own types.

A tiny random-weight model serves (its text is noise: every check holds whatever it says). The
second test deletes the app mid-batch and deploys it again on the same store: the batch must
complete with every request answered exactly once.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

PORT = 18901
APP = "batchapi"


def chat_lines(n: int, max_tokens: int = 8) -> bytes:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from openai import OpenAI
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", arch="qwen2", seed=7)
    store = tmp_path_factory.mktemp("batchstore")
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    args = app_args(
        model_dir,
        pools={"cold": {"initial_replicas": 0}},
        batch_api={"store_path": str(store), "poll_interval_s": 0.2, "max_in_flight": 8},
    )
    deploy(args, name=APP)
    client = OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", max_retries=0)
    yield client, args, store
    serve.shutdown()  # a proxy left on this port would swallow the next module's serve.start


def wait_status(client, batch_id: str, statuses: tuple, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")


def cli_rows() -> dict[str, list[str]]:
    """`tideserve batches` against the running app: batch id -> the rest of its row."""
    import contextlib
    import io

    from tideserve.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["batches", "--url", f"http://127.0.0.1:{PORT}"]) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:3] == ["id", "status", "done/total"]
    assert lines[-2].startswith("lane: ") and lines[-1].startswith("cold pool: ")
    return {row.split()[0]: row.split()[1:] for row in lines[1:-2]}


def outputs(client, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_files_and_batches_flow_end_to_end(served):
    from openai.types import Batch, FileDeleted, FileObject
    from openai.types.chat import ChatCompletion

    client, _, _ = served
    up = client.files.create(file=("in.jsonl", chat_lines(12)), purpose="batch")
    FileObject.model_validate(up.model_dump(), strict=True)
    assert up.purpose == "batch" and up.bytes == len(chat_lines(12))
    assert client.files.retrieve(up.id).id == up.id
    assert client.files.content(up.id).content == chat_lines(12)
    batch = client.batches.create(
        input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h",
        metadata={"job": "nightly"},
    )  # fmt: skip
    Batch.model_validate(batch.model_dump(), strict=True)
    assert batch.status == "in_progress" and batch.request_counts.total == 12
    done = wait_status(client, batch.id, ("completed", "failed", "expired"))
    Batch.model_validate(done.model_dump(), strict=True)
    assert done.status == "completed" and done.request_counts.completed == 12
    assert done.error_file_id is None and done.metadata == {"job": "nightly"}
    lines = outputs(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in lines) == sorted(f"req-{i}" for i in range(12))
    tokens = 0
    for line in lines:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = ChatCompletion.model_validate(line["response"]["body"], strict=True)
        assert body.usage.completion_tokens <= 8
        tokens += body.usage.total_tokens
    assert done.usage.total_tokens == tokens
    extra = done.model_extra["tideserve"]
    assert extra["progress"] == 1.0 and extra["tokens_done"] == tokens
    assert extra["idle_capacity_used_replica_s"] > 0
    listed = client.batches.list(limit=10)
    assert batch.id in [b.id for b in listed.data]
    assert cli_rows()[batch.id][:3] == ["completed", "12/12", "0"]
    deleted = client.files.delete(up.id)
    FileDeleted.model_validate(deleted.model_dump(), strict=True)
    assert deleted.deleted and up.id not in [f.id for f in client.files.list().data]


def test_completions_batch_with_a_bad_line_goes_to_the_error_file(served):
    client, _, _ = served
    rows = [
        {"custom_id": "ok", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "hello", "max_tokens": 4}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "hello", "max_tokens": 4, "temperature": 9}},
    ]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    up = client.files.create(file=("c.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=up.id, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_status(client, batch.id, ("completed", "failed", "expired"))
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    (ok,) = outputs(client, done.output_file_id)
    assert ok["custom_id"] == "ok" and ok["response"]["body"]["object"] == "text_completion"
    (bad,) = outputs(client, done.error_file_id)
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["param"] == "temperature"


def test_bad_requests_get_openai_errors(served):
    import openai

    client, _, _ = served
    up = client.files.create(file=("in.jsonl", chat_lines(2)), purpose="batch")
    cases = [
        (dict(endpoint="/v1/embeddings"), openai.BadRequestError, "embeddings"),
        (dict(completion_window="48h"), openai.BadRequestError, "completion_window"),
        (dict(input_file_id="file-nothere"), openai.NotFoundError, "no such file"),
    ]
    for override, kind, fragment in cases:
        args = dict(input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(kind) as err:
            client.batches.create(**{**args, **override})
        assert fragment in err.value.body["message"] and err.value.body["type"]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_doesnotexist")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-doesnotexist")
    raw = httpx.post(f"http://127.0.0.1:{PORT}/v1/batches", json={"input_file_id": up.id})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "endpoint"


def test_cancel_a_running_batch(served):
    client, _, _ = served
    up = client.files.create(file=("in.jsonl", chat_lines(200, max_tokens=32)), purpose="batch")
    batch = client.batches.create(
        input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_status(client, batch.id, ("cancelled",), timeout_s=60)
    assert done.cancelled_at is not None and done.request_counts.completed < 200


def test_app_restart_mid_batch_answers_every_request_once(served):
    from ray import serve

    client, args, store = served
    # The lane keeps running lines while Serve drains the app (about 3 s). With 40 lines, one
    # 2-vCPU AMD EPYC answered all 40 before the delete returned; another answered 20 of 160
    # (about 7 lines/s). 160 keeps the restart mid-batch on a machine several times faster.
    num = 160
    up = client.files.create(file=("in.jsonl", chat_lines(num, max_tokens=24)), purpose="batch")
    batch = client.batches.create(
        input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    journal = store / "batches" / f"{batch.id}.results.jsonl"
    deadline = time.monotonic() + 120
    while not journal.exists() or len(journal.read_bytes().splitlines()) < 3:
        assert time.monotonic() < deadline, "the batch made no progress"
        time.sleep(0.05)
    serve.delete(APP)  # the whole app goes: ingress, lane, replicas, in-flight requests
    done_before = len(journal.read_bytes().splitlines())
    assert 3 <= done_before < num, f"{done_before} of {num} answered before the kill"
    deploy(args, name=APP)
    done = wait_status(client, batch.id, ("completed", "failed", "expired"))
    assert done.status == "completed" and done.request_counts.completed == num
    lines = outputs(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in lines) == sorted(f"req-{i}" for i in range(num))
    indices = [json.loads(x)["index"] for x in journal.read_bytes().splitlines()]
    assert sorted(indices) == list(range(num))  # each line recorded once, none lost
