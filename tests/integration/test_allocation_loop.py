"""The allocation loop on a real local Ray: a cluster.yaml written by `tideserve plan` serves, and
`tideserve doctor` names the cause of three staged faults (R10): a KV budget too small for the
concurrency, a queue that grows because arrivals exceed capacity, hot and cold configs that
differ."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import time
from pathlib import Path

import pytest

from serving.llm.monitor import STEP_DELAY_ENV
from serving.tiny_models import save_tiny_model_dir
from tests.integration.serve_helpers import app_args, deploy, wait_ready

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PORT = 18740
NO_COLD = {"hot": {"num_replicas": 1}, "cold": {"initial_replicas": 0, "max_replicas": 1}}
SMOLLM2_CONFIG = {  # the embedded model's config.json (shape only; no weights are read)
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny")
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    yield {"model_dir": model_dir, "tmp": tmp_path_factory.mktemp("plan")}
    serve.shutdown()


def _load(app: str, n: int, prompt_len: int, max_tokens: int, rate_per_s: float) -> list:
    """`n` requests through the app's handle at `rate_per_s`; returns their futures."""
    from ray import serve

    handle = serve.get_app_handle(app)
    futures = []
    for i in range(n):
        prompt = [5 + (i + k) % 400 for k in range(prompt_len)]
        futures.append(handle.generate.remote(prompt, max_tokens=max_tokens, ignore_eos=True))
        time.sleep(1.0 / rate_per_s)
    return futures


def _verdict_while(app: str, load: cf.Future, want: str, timeout_s: float = 40.0):
    """Poll the doctor while the load runs, until it names `want` (each replica's step window
    closes every 5 s)."""
    from serving.llm.doctor import diagnose
    from serving.llm.doctor_cli import collect_readings

    deadline = time.monotonic() + timeout_s
    verdict = None
    while time.monotonic() < deadline:
        verdict = diagnose(collect_readings(app))
        if verdict.cause == want:
            break
        time.sleep(1.0)
    for f in load.result():  # let the load finish (refusals and all) before the app goes away
        with contextlib.suppress(Exception):  # 429s are part of the staged overload
            f.result(timeout_s=120)
    return verdict


def test_plan_writes_the_shipped_cluster_yaml_and_the_result_serves(served):
    from capacity.cli import main as capacity_main
    from serving.config import load_cluster_yaml

    model = served["tmp"] / "smollm2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    path = served["tmp"] / "cluster.yaml"
    path.write_bytes((REPO / "cluster.yaml").read_bytes())
    argv = ["plan", "--model", str(model), "--gpu", "L4", "--avg-input", "300"]
    argv += ["--avg-output", "100", "--max-model-len", "2048", "--peak-qps", "20"]
    assert capacity_main([*argv, "--json", "--write-cluster-yaml", str(path)]) == 0
    cfg = load_cluster_yaml(path)
    assert cfg.engine.kv_cache_bytes is None and cfg.engine.max_num_seqs > 32
    # Serve it as written; only what this 2-CPU test machine needs is changed: the tiny model
    # instead of SmolLM2, no CPU reservation, a small CPU KV cap.
    args = cfg.to_dict()
    args["model"] = {"source": str(served["model_dir"]), "served_name": "tiny"}
    args["replica"] |= {"num_cpus": 0, "health_check_period_s": 2}
    args["engine"] |= {"cpu_kv_cache_max_bytes": 16 * 2**20, "max_model_len": 512}
    args["pools"]["cold"] |= {"initial_replicas": 0}
    deploy(args, "planned", "/planned")
    from ray import serve

    out = serve.get_app_handle("planned").generate.remote([5, 6, 7], max_tokens=4).result()
    assert out.num_output_tokens == 4
    reading = serve.get_deployment_handle("hot", "planned").reading.remote().result()
    assert reading.max_num_seqs == cfg.engine.max_num_seqs
    assert reading.max_num_batched_tokens == cfg.engine.max_num_batched_tokens
    serve.delete("planned")


def test_doctor_names_a_kv_budget_too_small_for_the_concurrency(served):
    from ray import serve

    # 24 blocks of 16 tokens: one 100 + 100 token request at a time, under a cap of 16.
    engine = {"num_kv_blocks": 24, "max_num_seqs": 16, "min_num_seqs": 4, "max_model_len": 256}
    deploy(app_args(served["model_dir"], engine=engine, pools=NO_COLD), "kvfault", "/kvfault")
    with cf.ThreadPoolExecutor(1) as pool:
        # A burst, so requests queue on KV whatever the machine's speed: at 10 per second a
        # 2-vCPU AMD EPYC served the tiny model's requests one at a time as fast as they came
        # (nothing ever waited) and the doctor rightly saw only the cap's pressure, a warning.
        load = pool.submit(_load, "kvfault", 60, 100, 100, 200.0)
        verdict = _verdict_while("kvfault", load, "kv_budget")
    assert verdict.cause == "kv_budget", verdict
    assert verdict.knob == "engine.max_num_seqs" and verdict.change.startswith("16 -> ")
    serve.delete("kvfault")


def test_doctor_names_arrivals_that_exceed_capacity(served):
    from ray import serve

    # Every scheduled token costs 2 ms more: a compute-bound replica, whatever the batch size.
    args = app_args(served["model_dir"], pools=NO_COLD, engine={"max_num_seqs": 8})
    deploy(args, "busy", "/busy", env={"hot": {STEP_DELAY_ENV: "0.002"}})
    with cf.ThreadPoolExecutor(1) as pool:
        load = pool.submit(_load, "busy", 400, 20, 40, 20.0)
        verdict = _verdict_while("busy", load, "arrivals_exceed_capacity")
    assert verdict.cause == "arrivals_exceed_capacity", verdict
    assert verdict.knob == "pools.hot.num_replicas" and verdict.change.startswith("+")
    serve.delete("busy")


def test_doctor_names_hot_and_cold_configs_that_differ(served):
    from ray import serve

    from serving.app import _ingress_options, _replica_options
    from serving.config import AppConfig
    from serving.llm.doctor import diagnose
    from serving.llm.doctor_cli import collect_readings
    from serving.llm.replica import ModelReplica
    from serving.routes.ingress import HttpIngress

    hot_cfg = AppConfig.from_args(app_args(served["model_dir"]))
    cold_cfg = AppConfig.from_args(app_args(served["model_dir"], engine={"max_num_seqs": 8}))
    replica = serve.deployment(ModelReplica)
    hot = replica.options(**_replica_options(hot_cfg, "hot", 1, {})).bind(
        hot_cfg.replica_args(), "hot"
    )
    cold = replica.options(**_replica_options(cold_cfg, "cold", 1, {})).bind(
        cold_cfg.replica_args(), "cold"
    )
    ingress = serve.deployment(HttpIngress).options(**_ingress_options(hot_cfg))
    serve.run(ingress.bind(hot_cfg.replica_args(), hot, cold), name="drift", route_prefix="/drift")
    wait_ready("drift", pools_running=("hot", "cold"))
    verdict = diagnose(collect_readings("drift"))
    assert verdict.cause == "config_drift", verdict
    assert "engine.max_num_seqs" in verdict.summary
    assert "engine.max_num_seqs: hot 16, cold 8" in verdict.findings[0].evidence
    serve.delete("drift")
