"""An embedding app (`model.task: embed`) on a real local Ray cluster, over real HTTP.

A tiny random BERT in a sentence-transformers layout stands in for all-MiniLM-L6-v2; the openai
SDK's own types validate the responses strictly.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import time

import httpx
import numpy as np
import pytest

from serving.tiny_models import save_tiny_embedding_dir

pytestmark = pytest.mark.integration

APP = "embeddings"
PORT = 18600
NAME = "tiny-embed"


def embed_args(model_dir, **batching) -> dict:
    return {
        "model": {"task": "embed", "source": str(model_dir), "served_name": NAME},
        "dynamic_batching": {
            "max_batch_size": 8,
            "window_s": 0.01,
            "bucket_edges_tokens": [8, 32, 64],
        }
        | batching,
        "replica": {"num_cpus": 0, "torch_threads": 1, "health_check_period_s": 2},
    }


def deploy(args, name: str, route_prefix: str, timeout_s: float = 120.0) -> None:
    from ray import serve

    from serving.app import build_app

    serve.run(build_app(args), name=name, route_prefix=route_prefix, blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        if status is not None and str(status.status).endswith("RUNNING"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"app {name} not running after {timeout_s} s: {serve.status()}")


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    from serving.embed.model import EmbeddingModel

    model_dir = save_tiny_embedding_dir(tmp_path_factory.mktemp("e") / NAME, seed=11)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    deploy(embed_args(model_dir), APP, "/")
    yield {"base": f"http://127.0.0.1:{PORT}", "local": EmbeddingModel.load(model_dir)}
    serve.shutdown()


def alone(local, text_or_ids) -> np.ndarray:
    return np.array(local.embed([local.tokenize(text_or_ids)])[0])


def test_openai_sdk_embeddings_validate_strictly_and_match_each_text_alone(served):
    from openai import OpenAI
    from openai.types import CreateEmbeddingResponse

    client = OpenAI(base_url=served["base"] + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [NAME]
    texts = ["short", "a somewhat longer sentence about batching " * 3, "mid length text here"]
    for fmt in ({}, {"encoding_format": "float"}):  # left out: the server's default, float
        resp = client.embeddings.create(model=NAME, input=texts, **fmt)
        CreateEmbeddingResponse.model_validate(resp.model_dump(), strict=True)
        assert [d.index for d in resp.data] == [0, 1, 2]
        for d, text in zip(resp.data, texts, strict=True):
            np.testing.assert_allclose(d.embedding, alone(served["local"], text), atol=1e-5)
        tokens = sum(len(served["local"].tokenize(t)) for t in texts)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens == tokens
    one = client.embeddings.create(model=NAME, input=[5, 6, 7, 8], encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(one.data[0].embedding), dtype="<f4")  # SDK leaves it
    np.testing.assert_allclose(raw, alone(served["local"], [5, 6, 7, 8]), atol=1e-5)


def test_concurrent_requests_of_mixed_lengths_batch_and_stay_exact(served):
    url = served["base"] + "/v1/embeddings"
    texts = [("word " * n).strip() for n in (1, 40, 3, 25, 2, 60, 7, 12, 33, 5, 18, 50)]

    def post(text):
        return httpx.post(url, json={"input": text, "encoding_format": "float"}, timeout=60)

    with cf.ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(post, texts))
    assert [r.status_code for r in results] == [200] * len(texts)
    for r, text in zip(results, texts, strict=True):
        got = r.json()["data"][0]["embedding"]
        np.testing.assert_allclose(got, alone(served["local"], text), atol=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": []}, 400, "input"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "x", "dimensions": 7}, 400, "dimensions"),
        ({"input": [1, 99999]}, 400, "input"),
        ({"input": "x", "model": "nope"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_error_bodies(served, body, status, param):
    r = httpx.post(served["base"] + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_full_queue_is_429_with_retry_after_and_the_handle_api_works(served):
    from ray import serve

    deploy(embed_args(served["local"].model.name_or_path, max_queue=4), "small", "/small")
    r = httpx.post(served["base"] + "/small/v1/embeddings", json={"input": ["a"] * 5}, timeout=30)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    out = serve.get_app_handle("small").embed.remote(["a", "bb"]).result(timeout_s=60)
    assert out.model == NAME and len(out.vectors) == 2
    np.testing.assert_allclose(out.vectors[1], alone(served["local"], "bb"), atol=1e-5)
    serve.delete("small")
