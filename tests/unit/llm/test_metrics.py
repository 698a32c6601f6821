"""Metrics: the R10 pressure formula, gauge values from a hand-built snapshot, and the real
ray.serve.metrics objects built and recorded outside a replica (no ray.init needed)."""

from __future__ import annotations

import math

import pytest

from capacity.probe import GpuSample
from serving.llm import metrics as m
from tests.conftest import engine_stats


class FakeMetric:
    def __init__(self, kind, name, description, tag_keys, boundaries) -> None:
        self.kind, self.name, self.tag_keys, self.boundaries = kind, name, tag_keys, boundaries
        self.default_tags: dict[str, str] = {}
        self.values: dict[tuple, float] = {}  # gauges: last value per tag set
        self.observed: list[tuple[float, dict]] = []
        self.total = 0.0

    def set_default_tags(self, tags):
        self.default_tags = dict(tags)

    def _key(self, tags):
        full = {**self.default_tags, **(tags or {})}
        assert set(full) == set(self.tag_keys), (self.name, full)
        return tuple(sorted(full.items()))

    def set(self, value, tags=None):
        self.values[self._key(tags)] = value

    def observe(self, value, tags=None):
        self._key(tags)
        self.observed.append((value, {**self.default_tags, **(tags or {})}))

    def inc(self, value=1.0, tags=None):
        self._key(tags)
        assert value > 0
        self.total += value


def fake_metrics(pool: str = "hot") -> tuple[m.ReplicaMetrics, dict[str, FakeMetric]]:
    made: dict[str, FakeMetric] = {}

    def factory(kind, name, description, tag_keys, boundaries):
        made[name] = FakeMetric(kind, name, description, tag_keys, boundaries)
        return made[name]

    return m.ReplicaMetrics(pool, "smol", factory=factory), made


def gauge(metric: FakeMetric, **tags) -> float:
    return metric.values[tuple(sorted({**metric.default_tags, **tags}.items()))]


# ----- the R10 early warning ----------------------------------------------------------------------
def test_kv_pressure_formula():
    assert m.kv_pressure(8, 500.0, 4000) == 1.0
    assert m.kv_pressure(4, 500.0, 4000) == 0.5
    assert m.kv_pressure(0, 500.0, 4000) == 0.0


def test_kv_pressure_above_one_means_the_cap_outgrows_the_kv_budget():
    # 16 sequences averaging 300 tokens need 4800 tokens of KV; the pool holds 4096
    assert m.kv_pressure(16, 300.0, 4096) > 1.0


@pytest.mark.parametrize(
    ("running", "avg", "capacity", "field"),
    [(-1, 1.0, 10, "num_running"), (1, -1.0, 10, "avg_seq_len"), (1, math.nan, 10, "avg_seq_len"),
     (1, 1.0, 0, "kv_capacity_tokens")],
)  # fmt: skip
def test_kv_pressure_rejects_bad_inputs(running, avg, capacity, field):
    with pytest.raises(ValueError, match=field):
        m.kv_pressure(running, avg, capacity)


def test_engine_gauges_from_a_snapshot():
    values = m.engine_gauges(engine_stats(), avg_seq_len_tokens=200.0)
    assert values[m.KV_BLOCKS_USED] == 30
    assert values[m.KV_BLOCKS_RESERVED] == 45
    assert values[m.KV_BLOCKS_TOTAL] == 100
    assert values[m.TOKENS_PER_SECOND] == 123.0
    assert values[m.KV_PRESSURE] == pytest.approx(4 * 200 / 1600)
    assert values[m.KV_PRESSURE_AT_LIMIT] == pytest.approx(8 * 200 / 1600)
    assert values[m.ENGINE_QUEUE_WAIT_P99] == 0.2


# ----- ReplicaMetrics with a recording factory ---------------------------------------------------
def test_every_metric_is_created_once_with_the_pool_tag():
    rm, made = fake_metrics("cold")
    assert set(made) == set(m.METRICS)
    assert all(x.default_tags == {"pool": "cold", "model_name": "smol"} for x in made.values())
    assert all(x.name.startswith(("tideserve_", "vllm_")) for x in made.values())
    assert made[m.TTFT].boundaries == m.LATENCY_BUCKETS_S
    assert rm.pool == "cold"


def test_latency_buckets_span_10ms_to_120s_sorted():
    b = m.LATENCY_BUCKETS_S
    assert b[0] == 0.01 and b[-1] == 120.0 and list(b) == sorted(set(b))


def test_first_token_records_ttft_and_queue_wait_per_tier():
    rm, made = fake_metrics()
    rm.observe_first_token("interactive", 0.05, None)
    rm.observe_first_token("offline", 0.5, 0.25)
    tags = {"pool": "hot", "model_name": "smol"}
    assert made[m.TTFT].observed == [
        (0.05, {**tags, "tier": "interactive"}),
        (0.5, {**tags, "tier": "offline"}),
    ]
    assert made[m.QUEUE_WAIT].observed == [(0.25, {**tags, "tier": "offline"})]
    assert made[m.E2E_LATENCY].observed == []  # the end is recorded at the end


def test_end_records_e2e_and_decode_time_with_the_reason():
    rm, made = fake_metrics()
    rm.observe_end("interactive", 1.5, 0.05, "length")
    tags = {"pool": "hot", "model_name": "smol", "tier": "interactive", "finished_reason": "length"}
    assert made[m.E2E_LATENCY].observed == [(1.5, tags)]
    assert made[m.DECODE_TIME].observed == [(1.45, tags)]
    assert made[m.REQUEST_SUCCESS].total == 1.0


def test_an_end_that_is_no_engine_finish_counts_in_e2e_not_in_success():
    rm, made = fake_metrics()
    rm.observe_end("interactive", 0.8, 0.1, "cancelled")
    rm.observe_end("interactive", 3.0, None, "timeout")  # no first token: no decode time
    reasons = [tags["finished_reason"] for _, tags in made[m.E2E_LATENCY].observed]
    assert reasons == ["cancelled", "timeout"]
    assert len(made[m.DECODE_TIME].observed) == 1
    assert made[m.REQUEST_SUCCESS].total == 0.0


def test_end_reason_is_checked():
    rm, _ = fake_metrics()
    with pytest.raises(ValueError, match="reason='lost'"):
        rm.observe_end("interactive", 1.0, None, "lost")


def test_vllm_names_where_the_meaning_is_vllms():
    # the names Ray Serve LLM's Grafana panels query (ray_vllm_*)
    assert m.RUNNING_SEQS == "vllm_num_requests_running"
    assert m.WAITING_SEQS == "vllm_num_requests_waiting"
    assert m.KV_USAGE == "vllm_kv_cache_usage_perc"
    assert m.TTFT == "vllm_time_to_first_token_seconds"
    assert m.GENERATION_TOKENS == "vllm_generation_tokens"
    assert m.METRICS[m.REQUEST_SUCCESS][1][-1] == "finished_reason"
    assert all(tags[:2] == ("pool", "model_name") for _, tags, _ in m.METRICS.values())


def test_requests_tokens_and_tuner_moves_are_counted():
    from serving.engine.tuner import Move

    rm, made = fake_metrics()
    rm.count_request("ok")
    rm.count_request("refused")
    with pytest.raises(ValueError, match="status='lost'"):
        rm.count_request("lost")
    rm.count_tokens(120, 0)
    rm.count_tokens(0, 3)
    rm.count_tokens(0, 0)
    assert made[m.REQUESTS].total == 2.0
    assert (made[m.PROMPT_TOKENS].total, made[m.GENERATION_TOKENS].total) == (120.0, 3.0)
    rm.tuner_move(Move("raise", "max_num_seqs", 64, 512, "why"))
    assert gauge(made[m.TUNER_MAX_NUM_SEQS]) == 64.0
    assert gauge(made[m.TUNER_BATCHED_TOKENS]) == 512.0
    assert made[m.TUNER_MOVES].total == 1.0


@pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
def test_latencies_reject_bad_durations(bad):
    rm, _ = fake_metrics()
    with pytest.raises(ValueError, match="duration"):
        rm.observe_first_token("offline", bad, 0.0)
    with pytest.raises(ValueError, match="duration"):
        rm.observe_end("offline", bad, None, "stop")


def test_update_engine_sets_gauges_and_per_tier_counts():
    rm, made = fake_metrics()
    rm.update_engine(engine_stats(), avg_seq_len_tokens=200.0)
    assert gauge(made[m.KV_BLOCKS_USED]) == 30.0
    assert gauge(made[m.KV_USAGE]) == 0.45  # reserved 45 of 100 blocks
    assert gauge(made[m.KV_PRESSURE]) == pytest.approx(0.5)
    assert gauge(made[m.RUNNING_SEQS], tier="interactive") == 3.0
    assert gauge(made[m.RUNNING_SEQS], tier="offline") == 1.0
    assert gauge(made[m.WAITING_SEQS], tier="interactive") == 2.0
    assert gauge(made[m.WAITING_SEQS], tier="offline") == 0.0
    # a tier that empties reads 0, not its last count
    rm.update_engine(engine_stats(running_by_tier={"interactive": 1}), 200.0)
    assert gauge(made[m.RUNNING_SEQS], tier="offline") == 0.0


def test_counters_add_the_engine_totals_deltas():
    rm, made = fake_metrics()
    rm.update_engine(engine_stats(num_preemptions=3, num_timeouts=1), 10.0)
    rm.update_engine(engine_stats(num_preemptions=3, num_timeouts=1), 10.0)
    rm.update_engine(engine_stats(num_preemptions=5, num_timeouts=1), 10.0)
    assert made[m.PREEMPTIONS].total == 5.0
    assert made[m.TIMEOUTS].total == 1.0
    rm.update_engine(engine_stats(num_preemptions=2), 10.0)  # a new engine: restart from 2
    rm.update_engine(engine_stats(num_preemptions=4), 10.0)
    assert made[m.PREEMPTIONS].total == 7.0


def test_lora_slot_counters_and_gauges_per_replica():
    rm, made = fake_metrics()
    lora = {"lora_slots_total": 2, "lora_in_slots": ("a",)}
    rm.update_engine(engine_stats(num_lora_hits=5, num_lora_loads=2, **lora), 10.0)
    lora = {"lora_slots_total": 2, "lora_in_slots": ("a", "b")}
    rm.update_engine(
        engine_stats(num_lora_hits=9, num_lora_loads=4, num_lora_evictions=1, **lora), 10.0
    )
    assert made[m.LORA_HITS].total == 9.0
    assert made[m.LORA_LOADS].total == 4.0
    assert made[m.LORA_EVICTIONS].total == 1.0
    assert gauge(made[m.LORA_SLOTS_USED]) == 2.0
    assert gauge(made[m.LORA_SLOTS_TOTAL]) == 2.0
    assert made[m.LORA_LOADS].kind == "counter"  # scraped as ray_tideserve_lora_loads_total


def test_update_gpus_sets_per_gpu_gauges_and_skips_unreadable_utilization():
    rm, made = fake_metrics()
    samples = [
        GpuSample(0, "NVIDIA H200", 10 * 2**30, 141 * 2**30, 87.0, 412.5),
        GpuSample(1, "NVIDIA H200 MIG", 2**30, 2**34, math.nan),
    ]
    assert rm.update_gpus(samples) == samples
    assert gauge(made[m.GPU_UTILIZATION], gpu="0") == 87.0
    assert gauge(made[m.GPU_POWER], gpu="0") == 412.5
    assert ("gpu", "1") not in {k for key in made[m.GPU_POWER].values for k in key}
    assert gauge(made[m.GPU_MEMORY_USED], gpu="0") == 10 * 2**30
    assert gauge(made[m.GPU_MEMORY_TOTAL], gpu="1") == 2**34
    assert ("gpu", "1") not in {k for key in made[m.GPU_UTILIZATION].values for k in key}


def test_update_gpus_without_a_gpu_records_nothing():
    rm, made = fake_metrics()
    assert rm.update_gpus() == []  # this machine: NVML unavailable
    assert made[m.GPU_MEMORY_USED].values == {}


def test_pool_is_checked():
    with pytest.raises(ValueError, match="pool"):
        m.ReplicaMetrics("")


# ----- the real ray.serve.metrics objects, outside a replica and without ray.init --------------
def test_real_serve_metrics_build_and_record_without_a_cluster():
    rm = m.ReplicaMetrics("hot")
    rm.observe_first_token("interactive", 0.02, 0.001)
    rm.observe_end("interactive", 0.9, 0.02, "cancelled")
    rm.update_engine(engine_stats(num_preemptions=2), avg_seq_len_tokens=120.0)
    rm.update_gpus([GpuSample(0, "fake", 1, 2, 3.0)])
    # Ray validates tags at record time even with nowhere to send them
    with pytest.raises(ValueError, match="tier"):
        rm._metrics[m.RUNNING_SEQS].set(1.0)


# ----- the example dashboard reads exactly these metrics -----------------------------------------
def test_grafana_dashboard_queries_the_exported_names():
    import json
    import re
    from pathlib import Path

    path = Path(__file__).parents[3] / "examples" / "grafana_dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = set(re.findall(r"\bray_((?:tideserve_|vllm_)\w+)", " ".join(exprs)))
    suffix = {"histogram": "_bucket", "counter": "_total", "gauge": ""}
    exported = {name + suffix[kind] for name, (kind, _, _) in m.METRICS.items()}
    assert used <= exported, f"dashboard queries unknown metrics: {sorted(used - exported)}"
    assert exported <= used, f"metrics without a panel: {sorted(exported - used)}"


def test_prefix_cache_queries_and_hits_count_the_engines_running_totals():
    rm, made = fake_metrics()
    rm.update_engine(engine_stats(prefix_cache_query_tokens=400, prefix_cache_hit_tokens=300), 0.0)
    rm.update_engine(engine_stats(prefix_cache_query_tokens=500, prefix_cache_hit_tokens=320), 0.0)
    assert made[m.PREFIX_QUERIES].name == "vllm_prefix_cache_queries"
    assert made[m.PREFIX_HITS].name == "vllm_prefix_cache_hits"
    assert (made[m.PREFIX_QUERIES].total, made[m.PREFIX_HITS].total) == (500.0, 320.0)
