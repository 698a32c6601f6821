"""Overload and priority isolation, shortened for CI (benchmarks/hardening.py runs them at full
length): 3x capacity gets 429 + Retry-After while the admitted keep their SLO (admission by
predicted TTFT) and goodput holds, memory stays bounded, nothing crashes; an offline flood at 10x
capacity is refused, not queued in front of interactive requests, whose admitted keep their SLO;
past the bounded front door Serve's proxy itself answers 429 + Retry-After.
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.loadgen import isolation_scenario, overload_scenario
from serving.tiny_models import SMALL_LLAMA, save_tiny_model_dir
from tests.integration.serve_helpers import (
    IDLE,
    OVERLOAD_TTFT_SLO_S,
    deploy,
    overload_args,
    wait_idle,
)

pytestmark = pytest.mark.integration

PORT = 18720
APP = "overload"
TTFT_SLO_S = OVERLOAD_TTFT_SLO_S


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory):
    from ray import serve

    model_dir = save_tiny_model_dir(tmp_path_factory.mktemp("m") / "small", **SMALL_LLAMA)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    deploy(overload_args(model_dir), APP, f"/{APP}")
    yield {"url": f"http://127.0.0.1:{PORT}/{APP}/v1/completions", "model_dir": model_dir}
    serve.shutdown()


def test_three_times_capacity_gets_429s_and_the_admitted_keep_their_slo(served):
    report = asyncio.run(
        overload_scenario(
            served["url"], APP, duration_s=12, probe_s=4, concurrency=8, factors=(1.0, 3.0)
        )
    )
    print(report)
    assert report["capacity_rps"] > 1
    at_1x, at_3x = report["runs"]["1x"], report["runs"]["3x"]
    tier = at_3x["tiers"]["interactive"]
    refused = tier["statuses"].get("429", 0)
    assert refused >= 0.2 * tier["num_sent"], tier  # the excess is refused, not queued
    assert at_3x["num_429_without_retry_after"] == 0
    assert report["runs"]["3x"]["num_5xx_or_transport_errors"] == 0, tier
    assert set(tier["statuses"]) <= {"200", "429"}, tier  # no error events inside streams
    # Admitted requests' TTFT: p50 within the SLO; p99 within 1.5x of it here, where the client,
    # the proxy, the ingress and both replicas share 2 cores and every refusal costs CPU too.
    # benchmarks/hardening.py measures p99 against the SLO itself over 60 s.
    assert tier["ttft_p50_s"] <= TTFT_SLO_S, tier
    assert tier["ttft_p99_s"] <= 1.5 * TTFT_SLO_S, tier
    # Overload does not eat the work done within SLO. Every refusal costs CPU in the proxy, the
    # ingress and this client (about 14 ms together on a machine whose probe measured 20 rps),
    # and here they share 2 cores with the replicas: at 3x of 20 rps that took a third of the
    # replicas' CPU, and goodput fell to 0.55x of 1x's. So the work the replicas do per core
    # they get must hold (0.9x over 60 s in the benchmark), and the goodput itself must not
    # collapse. 12 s windows are noisier: 1x's own goodput per core varied 7.7-11.4 rps over
    # three runs on one Intel Xeon (its batches fill when the probe reads high), and the ratio
    # 0.69-0.88, so the bound is 0.6x: a collapse, not a noisy window, fails it.
    assert _goodput_per_replica_core(at_3x) >= 0.6 * _goodput_per_replica_core(at_1x), (
        at_1x,
        at_3x,
    )
    assert at_3x["goodput_rps"] >= 0.4 * at_1x["goodput_rps"], (at_1x, at_3x)
    rss = report["rss_bytes"]
    assert rss["first"] > 0 and rss["max"] <= 1.25 * rss["first"], rss
    assert all(state == IDLE for state in wait_idle(APP).values())


def _goodput_per_replica_core(run: dict) -> float:
    cores = run["cpu_cores_by_process"]
    return run["goodput_rps"] / max(cores["replica_hot"] + cores["replica_cold"], 1e-3)


def test_offline_flood_is_refused_and_interactive_keeps_its_slo(served):
    report = asyncio.run(
        isolation_scenario(
            served["url"], duration_s=10, probe_s=4, concurrency=8, interactive_rps=2.0
        )
    )
    print({k: v for k, v in report.items() if k != "loaded"}, report["loaded"])
    offline = report["loaded"]["offline"]
    assert offline["statuses"].get("429", 0) > 0  # the flood really exceeded capacity
    interactive = report["loaded"]["interactive"]
    # Under a 10x offline flood the interactive tier keeps its SLO: the front door's share for the
    # lower tiers refuses the flood before it queues, and offline work yields its engine slot to
    # a waiting interactive request. benchmarks/results/hardening_isolation_offline_yields.json
    # (60 s, Intel Xeon, 2 vCPUs): 121 of 121 served, admitted TTFT p50 0.107 s, p99 0.28 s.
    # This test's 10 s on the 2 shared AMD EPYC vCPUs, two runs on 2026-12-03: 22 of 22 served,
    # p50 0.069 and 0.090 s, p99 0.40 and 0.35 s. The bounds leave a loaded CI machine room: a few
    # refusals (with Retry-After), p50 at 5x and p99 at 2.5x what was measured, within the SLO.
    assert set(interactive["statuses"]) <= {"200", "429"}, interactive
    assert interactive["statuses"].get("200", 0) >= 0.8 * interactive["num_sent"], interactive
    assert interactive["retry_after_missing"] == 0
    assert interactive["ttft_p50_s"] <= 0.5 * TTFT_SLO_S, interactive
    assert interactive["ttft_p99_s"] <= TTFT_SLO_S, interactive
    assert all(state == IDLE for state in wait_idle(APP).values())


def test_past_the_bounded_front_door_the_proxy_answers_429_with_retry_after(served):
    """An app whose ingress holds 1 request and lets 1 wait: a burst of 12 is answered by Serve's
    own backpressure in the proxy (429 + Retry-After, before the ingress), never a 5xx."""
    import httpx
    from ray import serve

    from tests.integration.serve_helpers import app_args

    args = app_args(
        served["model_dir"],
        engine={"max_model_len": 256, "max_num_seqs": 2, "min_num_seqs": 2},
        pools={"cold": {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0}},
        server={"ingress_max_ongoing_requests": 1, "ingress_max_queued_requests": 1},
    )
    deploy(args, "frontdoor", "/frontdoor")
    url = f"http://127.0.0.1:{PORT}/frontdoor/v1/completions"
    body = {"prompt": "def main(): return", "max_tokens": 64, "ignore_eos": True}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(12))))

    try:
        answers = asyncio.run(burst())
    finally:
        serve.delete("frontdoor")
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) <= {200, 429} and 200 in statuses, statuses
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) >= 6, statuses  # 1 held + 1 queued (+ a few through as streams end)
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert any("backpressure" in r.text for r in refused), [r.text[:120] for r in refused]
