"""LoRA adapters over real HTTP, driven by the openai SDK: `model` names the base or an adapter,
/v1/models lists both, vLLM's load/unload endpoints (open without an API key, keyed with one),
404 for an unknown model, 400 for a bad adapter saying why, and greedy output of an adapter that
differs from the base and repeats. A tiny random qwen2 serves, with adapters PEFT wrote for it.

Two apps on one Serve: `lora` (no API key; a hot and a cold replica, so a runtime-loaded adapter
must reach the replica that did not validate it) and `lora_keyed` (server.api_key_env set).
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from serving.tiny_adapters import save_random_lora
from serving.tiny_models import save_tiny_model_dir, tiny_model
from tests.integration.serve_helpers import app_args, deploy

pytestmark = pytest.mark.integration

PORT = 18470
BASE = f"http://127.0.0.1:{PORT}"
KEY = "sk-test-" + uuid.uuid4().hex
KEY_ENV = "TIDESERVE_TEST_LORA_KEY"
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from openai import OpenAI
    from ray import serve

    root = tmp_path_factory.mktemp("lora")
    model_dir = save_tiny_model_dir(root / "tiny", arch="qwen2", seed=7)
    paths = {
        name: str(save_random_lora(tiny_model("qwen2", seed=7), root / name, b_std=0.1, **kw))
        for name, kw in {
            "sql": dict(rank=4, seed=1),
            "chat": dict(rank=8, seed=2),
            "wide": dict(rank=16, seed=3),  # above max_lora_rank: refused with a 400
        }.items()
    }
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    lora = {"max_loras": 2, "max_lora_rank": 8}
    args = app_args(model_dir, engine=lora, model={"adapters": {"sql": paths["sql"]}})
    deploy(args, name="lora")
    keyed = app_args(
        model_dir,
        engine=lora,
        pools={"cold": {"initial_replicas": 0}},
        server={"api_key_env": KEY_ENV},
    )
    deploy(keyed, name="lora_keyed", route_prefix="/keyed", env={"ingress": {KEY_ENV: KEY}})
    client = OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0)
    yield client, paths
    serve.shutdown()


def greedy(client, model: str, prompt: str = PROMPT) -> tuple[str, str]:
    out = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
    return out.choices[0].text, out.model


def test_models_lists_the_base_and_its_declared_adapter_with_parent(served):
    client, paths = served
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny", "sql"}
    assert models["sql"].model_extra["parent"] == "tiny"
    assert models["sql"].model_extra["root"] == paths["sql"]


def test_an_adapter_changes_greedy_output_and_repeats_it(served):
    client, _ = served
    base, base_model = greedy(client, "tiny")
    sql, sql_model = greedy(client, "sql")
    assert (base_model, sql_model) == ("tiny", "sql")  # the response names what served it
    assert sql != base
    assert greedy(client, "sql")[0] == sql and greedy(client, "tiny")[0] == base
    chat = client.chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
    )
    assert chat.model == "sql" and chat.choices[0].finish_reason in ("stop", "length")
    streamed = client.completions.create(
        model="sql", prompt=PROMPT, max_tokens=16, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == sql


def test_an_unknown_model_is_a_404_naming_it(served):
    from openai import NotFoundError

    client, _ = served
    with pytest.raises(NotFoundError, match="no-such-model") as err:
        greedy(client, "no-such-model")
    assert err.value.body["code"] == "model_not_found" and "sql" in err.value.body["message"]


def test_load_serve_on_every_replica_then_unload(served):
    from openai import NotFoundError
    from ray import serve

    client, paths = served
    r = httpx.post(
        f"{BASE}/v1/load_lora_adapter",
        json={"lora_name": "chat", "lora_path": paths["chat"]},
        timeout=60,
    )
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'chat' added successfully."
    models = {m.id: m for m in client.models.list().data}
    assert models["chat"].model_extra["parent"] == "tiny"
    hot_text, _ = greedy(client, "chat")  # interactive: the hot replica, which validated it
    assert hot_text != greedy(client, "tiny")[0]
    # analytical goes to the cold replica first: it registers the adapter from its path there
    handle = serve.get_app_handle("lora")
    cold = handle.generate.remote(
        PROMPT, max_tokens=16, priority="analytical", model="chat", temperature=0
    ).result(timeout_s=60)
    assert cold.pool == "cold" and cold.text == hot_text

    r = httpx.post(f"{BASE}/v1/unload_lora_adapter", json={"lora_name": "chat"}, timeout=30)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'chat' removed successfully."
    with pytest.raises(NotFoundError, match="chat"):
        greedy(client, "chat")
    assert "chat" not in {m.id for m in client.models.list().data}
    r = httpx.post(f"{BASE}/v1/unload_lora_adapter", json={"lora_name": "chat"}, timeout=30)
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"lora_name": "ghost", "lora_path": "/nonexistent/adapter"}, "is not a directory"),
        ({"lora_name": "wide", "lora_path": "PATH:wide"}, "max_lora_rank"),
        ({"lora_name": "sql", "lora_path": "PATH:chat"}, "already been loaded"),
        ({"lora_name": "tiny", "lora_path": "PATH:chat"}, "conflicts with a served base model"),
        ({"lora_name": "x", "lora_path": "PATH:chat", "load_inplace": True}, "load_inplace"),
        ({"lora_name": "x"}, "lora_path"),
    ],
)
def test_a_bad_load_is_a_400_saying_why(served, body, says):
    client, paths = served
    body = {
        k: paths[v.removeprefix("PATH:")] if isinstance(v, str) and v.startswith("PATH:") else v
        for k, v in body.items()
    }
    before = {m.id for m in client.models.list().data}
    r = httpx.post(f"{BASE}/v1/load_lora_adapter", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    assert {m.id for m in client.models.list().data} == before  # nothing half-loaded


def test_the_replica_counts_adapter_hits_and_loads(served):
    from ray import serve

    client, _ = served
    greedy(client, "sql")
    reading = serve.get_deployment_handle("hot", "lora").reading.remote().result(timeout_s=30)
    assert reading.lora_slots_total == 2
    assert reading.lora.admissions >= 1 and reading.lora.loads >= 1
    assert reading.lora.load_s > 0  # the slot writes' time, which the autoscaler charges


def test_with_an_api_key_load_and_unload_need_it(served):
    from openai import AuthenticationError, OpenAI

    _, paths = served
    url = f"{BASE}/keyed/v1/load_lora_adapter"
    body = {"lora_name": "sql", "lora_path": paths["sql"]}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    wrong = {"authorization": "Bearer sk-wrong"}
    assert httpx.post(url, json=body, headers=wrong, timeout=30).status_code == 401
    auth = {"authorization": f"Bearer {KEY}"}
    assert httpx.post(url, json=body, headers=auth, timeout=60).status_code == 200
    keyed = OpenAI(base_url=f"{BASE}/keyed/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in keyed.models.list().data] == ["tiny", "sql"]
    assert keyed.completions.create(model="sql", prompt=PROMPT, max_tokens=4).model == "sql"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{BASE}/keyed/v1", api_key="sk-wrong", max_retries=0).models.list()
    unload, name = f"{BASE}/keyed/v1/unload_lora_adapter", {"lora_name": "sql"}
    assert httpx.post(unload, json=name, timeout=30).status_code == 401
    assert httpx.post(unload, json=name, headers=auth, timeout=30).status_code == 200
