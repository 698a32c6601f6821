"""Prefix-aware routing measured on a real Serve app: two replicas behind the PrefixAffinityRouter
(the app picks it because engine.prefix_caching is on) serve multi-turn conversations sent over
HTTP, and the hit rate of their prefix caches is at least 0.9x what one engine serving every
conversation reaches on the same prompts.

Each conversation resends a shared system prompt, its whole history (earlier user turns and the
replies, as the tiny tokenizer encodes their text) and a new user message; the conversations run
at once, one client thread each. The replicas' numbers are their prefix-cache query and hit
tokens (what they export as vllm_prefix_cache_queries / vllm_prefix_cache_hits), taken before and
after the traffic. The reference replays the same conversations (the prompts as they were sent)
through one LLMEngine with the replicas' engine config, the same way: every conversation at once,
a conversation's next turn submitted when its previous one ends. (Replayed one request at a time
instead, one engine would also reuse what concurrent requests cannot: the shared system prompt
while the first turns are prefilled together. That is a property of the load, not of routing.)

The system prompt is shorter than the router's 128-token key, so a conversation's key holds its
first user message and the conversations spread over both replicas (the test checks that both
served some); a key that every request shares would send them all to one replica, and the ratio
would then be 1.0 by construction.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

APP = "tideserve_prefix_routing"
PORT = 18764
NUM_CONVS, NUM_TURNS = 12, 4
SYSTEM_TOKENS = 48  # 3 blocks of 16: below the router's 128-token key
MAX_TOKENS = 8
TWO_REPLICAS = {"hot": {"num_replicas": 2}, "cold": {"initial_replicas": 0, "max_replicas": 1}}


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", seed=34)
    args = app_args(model_dir, pools=TWO_REPLICAS, controller={"enabled": False})
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    deploy(args, name=APP)
    try:
        yield {"args": args, "model_dir": model_dir, "base": f"http://127.0.0.1:{PORT}"}
    finally:
        serve.delete(APP)
        serve.shutdown()


def prefix_counters(app: str, num_replicas: int) -> dict[str, tuple[int, int]]:
    """replica id -> (prefix-cache query tokens, hit tokens) of every hot replica. Serve picks
    the replica of each call (no prompt: by KV headroom), so ask until each one answered."""
    from ray import serve

    handle = serve.get_deployment_handle("hot", app)
    seen: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + 60
    while len(seen) < num_replicas and time.monotonic() < deadline:
        r = handle.reading.remote().result(timeout_s=30)
        seen[r.replica_id] = (r.prefix_cache_query_tokens, r.prefix_cache_hit_tokens)
    assert len(seen) == num_replicas, f"only {sorted(seen)} of {num_replicas} replicas answered"
    return seen


def converse(base: str, tokenizer, system, users, sent: list[list[int]]) -> None:
    """One conversation, turn after turn, over HTTP; its prompts are appended to `sent`."""
    history = list(system)
    with httpx.Client(base_url=base, timeout=60) as client:
        for user in users:
            history += user
            sent.append(list(history))
            body = {
                "model": "tiny", "prompt": history, "max_tokens": MAX_TOKENS,
                "temperature": 0, "ignore_eos": True,
            }  # fmt: skip
            resp = client.post("/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            reply = resp.json()["choices"][0]["text"]
            history += tokenizer(reply, add_special_tokens=False).input_ids


def one_engine_hit_fraction(args: dict, model_dir, convs: list[list[list[int]]]) -> float:
    """The hit rate of one engine (the replicas' engine config) serving every conversation's
    prompts: all conversations at once, each next turn when the previous one ended."""
    from serving.config import AppConfig
    from serving.engine import LLMEngine, SamplingParams

    engine = LLMEngine.from_pretrained(str(model_dir), AppConfig.from_args(args).engine)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    owner = {engine.add_request(prompts[0], params): (c, 0) for c, prompts in enumerate(convs)}
    while engine.has_unfinished():
        for seq in engine.step():
            if seq.finished:
                c, turn = owner.pop(seq.request_id)
                if turn + 1 < len(convs[c]):
                    owner[engine.add_request(convs[c][turn + 1], params)] = (c, turn + 1)
    return engine.stats().prefix_cache_hit_fraction


def test_two_routed_replicas_hit_their_caches_nearly_as_often_as_one_replica_serving_all(served):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(served["model_dir"]))
    rng = random.Random(34)
    system = [rng.randrange(3, 400) for _ in range(SYSTEM_TOKENS)]
    convs = [
        [[rng.randrange(3, 400) for _ in range(rng.randint(8, 24))] for _ in range(NUM_TURNS)]
        for _ in range(NUM_CONVS)
    ]
    before = prefix_counters(APP, 2)
    sent: list[list[list[int]]] = [[] for _ in convs]  # each conversation's prompts
    with ThreadPoolExecutor(NUM_CONVS) as pool:
        futures = [
            pool.submit(converse, served["base"], tokenizer, system, users, prompts)
            for users, prompts in zip(convs, sent, strict=True)
        ]
        for f in futures:
            f.result(timeout=300)
    after = prefix_counters(APP, 2)
    delta = {r: (after[r][0] - before[r][0], after[r][1] - before[r][1]) for r in after}
    queried = sum(q for q, _ in delta.values())
    routed = sum(h for _, h in delta.values()) / queried
    reference = one_engine_hit_fraction(served["args"], served["model_dir"], sent)
    print(
        f"routed hit rate {routed:.4f} over 2 replicas {delta}; one engine {reference:.4f}; "
        f"ratio {routed / reference:.4f}"
    )
    assert queried == sum(len(p) for c in sent for p in c)  # each prompt looked up once
    assert all(q > 0 for q, _ in delta.values()), f"one replica served nothing: {delta}"
    assert reference > 0.5  # later turns resend what earlier ones computed
    assert routed >= 0.9 * reference, f"routed {routed:.4f} < 0.9 x one engine {reference:.4f}"
