"""KVHeadroomRouter and ReplicaMetrics in a real Serve app (no model: a dummy deployment).

Two replicas of one deployment report routing stats through `record_routing_stats`; one reports
far more KV headroom than the other, so once the stats reached the handle's router nearly every
request must land on it, and on the other one after the test swaps their roles. The same
replicas record ReplicaMetrics, and the test reads them back from Ray's Prometheus endpoint
under their exported names.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration

APP = "tideserve_routing_test"
STATS_PERIOD_S = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class ReportLog:
    """Which rank reports the big headroom, and how often each rank has reported.

    One actor call both counts a report and tells its role, so report number n+1 after a flip
    is sure to carry the new role.
    """

    def __init__(self) -> None:
        self.big_rank = 0
        self.counts: dict[int, int] = {}

    def report(self, rank: int) -> int:
        self.counts[rank] = self.counts.get(rank, 0) + 1
        return self.big_rank

    def flip(self, big_rank: int) -> dict[int, int]:
        self.big_rank = big_rank
        return dict(self.counts)

    def get(self) -> dict[int, int]:
        return dict(self.counts)


class DummyReplica:
    """The 'big' rank reports 100k free KV tokens, the other 1k and a queue."""

    def __init__(self, report_log) -> None:
        from ray import serve

        from serving.llm.metrics import ReplicaMetrics

        self.rank = serve.get_replica_context().rank.rank
        self.report_log = report_log
        self.metrics = ReplicaMetrics("hot")

    async def record_routing_stats(self) -> dict:
        from capacity.probe import GpuSample

        big = await self.report_log.report.remote(self.rank) == self.rank
        engine = SimpleNamespace(  # duck-typed EngineStats: no torch in this replica
            running_by_tier={"interactive": 2},
            waiting_by_tier={"offline": 1},
            num_running=2,
            num_kv_blocks_total=100,
            num_kv_blocks_used=10,
            num_kv_blocks_reserved=20,
            block_size_tokens=16,
            concurrency_limit=8,
            tokens_per_s=42.0,
            queue_wait_p50_s=0.01,
            queue_wait_p99_s=0.05,
            num_preemptions=3,
            num_timeouts=0,
            kv_use_fraction=0.2,
            prefix_cache_query_tokens=0,
            prefix_cache_hit_tokens=0,
            num_lora_hits=0,
            num_lora_loads=0,
            num_lora_evictions=0,
            lora_slots_total=0,
            lora_in_slots=(),
        )
        self.metrics.update_engine(engine, avg_seq_len_tokens=400.0)  # pressure 2*400/1600
        self.metrics.update_gpus([GpuSample(0, "fake", 2**30, 2**34, 55.0)])
        return {
            "kv_free_tokens": 100_000 if big else 1_000,
            "kv_reserved_tokens": 0,
            "kv_total_tokens": 200_000,
            "queued_tokens": 0 if big else 500,
            "num_waiting": 0 if big else 3,
            "num_running": 0,
        }

    async def __call__(self) -> int:
        self.metrics.observe_first_token("interactive", 0.03, 0.001)
        self.metrics.observe_end("interactive", 0.2, 0.03, "stop")
        self.metrics.count_tokens(5, 7)
        return self.rank


@pytest.fixture(scope="module")
def app(ray_cluster):
    ray = ray_cluster
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    report_log = ray.remote(num_cpus=0)(ReportLog).remote()
    deployment = serve.deployment(
        DummyReplica,
        name="hot",
        num_replicas=2,
        max_ongoing_requests=100,  # the test is about ranking, not about a full replica
        ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(
            request_router_class="serving.llm.router:KVHeadroomRouter",
            request_routing_stats_period_s=STATS_PERIOD_S,
        ),
    )
    try:
        handle = serve.run(deployment.bind(report_log), name=APP, route_prefix=None)
        yield SimpleNamespace(ray=ray, handle=handle, report_log=report_log)
    finally:
        serve.delete(APP)
        serve.shutdown()
        ray.kill(report_log)


def wait_until_routers_saw_reports_after(app, counts: dict[int, int]) -> None:
    """Two more reports from each replica: the controller has collected the first of them (it
    asks again only once the previous answer is in) and pushes it to routers by long poll."""

    def enough():
        now = app.ray.get(app.report_log.get.remote(), timeout=10)
        return len(now) == 2 and all(now[r] >= counts.get(r, 0) + 2 for r in now)

    wait_for(enough, timeout_s=20, what=f"two more routing-stats reports after {counts}")
    time.sleep(2 * STATS_PERIOD_S)  # long-poll propagation to this handle's router


def route_20(app) -> list[int]:
    responses = [app.handle.remote() for _ in range(20)]
    ranks = [r.result(timeout_s=20) for r in responses]
    assert set(ranks) <= {0, 1}
    return ranks


def test_router_sends_most_requests_to_the_replica_with_most_headroom(app):
    wait_until_routers_saw_reports_after(app, {})
    ranks = route_20(app)
    assert ranks.count(0) >= 16, f"rank 0 (big headroom) got {ranks.count(0)}/20: {ranks}"
    # Swap the roles: traffic must follow the stats, not the order Serve lists replicas in.
    counts = app.ray.get(app.report_log.flip.remote(1), timeout=10)
    wait_until_routers_saw_reports_after(app, counts)
    ranks = route_20(app)
    assert ranks.count(1) >= 16, f"rank 1 (big headroom) got {ranks.count(1)}/20: {ranks}"


def test_replica_metrics_reach_prometheus_under_ray_prefixed_names(app):
    assert app.handle.remote().result(timeout_s=20) in (0, 1)  # one request observed at least
    from serving.ray_internals import metrics_export_port

    url = f"http://127.0.0.1:{metrics_export_port()}/metrics"
    expected = [
        "ray_vllm_time_to_first_token_seconds_bucket{",
        "ray_vllm_e2e_request_latency_seconds_count{",
        "ray_vllm_request_queue_time_seconds_sum{",
        "ray_vllm_request_success_total{",
        "ray_vllm_generation_tokens_total{",
        "ray_vllm_kv_cache_usage_perc{",
        "ray_tideserve_kv_blocks_used{",
        "ray_tideserve_kv_blocks_reserved{",
        "ray_tideserve_kv_blocks_total{",
        "ray_vllm_num_requests_running{",
        "ray_vllm_num_requests_waiting{",
        "ray_tideserve_tokens_per_second{",
        "ray_tideserve_kv_pressure{",
        "ray_tideserve_kv_pressure_at_limit{",
        "ray_vllm_num_preemptions_total{",
        "ray_tideserve_gpu_utilization_pct{",
        "ray_tideserve_gpu_memory_used_bytes{",
    ]

    def scrape() -> str | None:
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            return None
        return body if all(name in body for name in expected) else None

    # Workers push to the metrics agent every few seconds (Ray's report interval).
    body = wait_for(scrape, timeout_s=40, what=f"tideserve metrics at {url}", poll_s=1.0)
    pressure = [
        line
        for line in body.splitlines()
        if line.startswith("ray_tideserve_kv_pressure{") and f'application="{APP}"' in line
    ]
    assert pressure, "no kv_pressure sample of this app"
    assert all('pool="hot"' in line and 'deployment="hot"' in line for line in pressure)
    assert float(pressure[0].rsplit(" ", 1)[1]) == pytest.approx(2 * 400 / 1600)
