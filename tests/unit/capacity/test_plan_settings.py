"""What `plan --write-cluster-yaml` writes (capacity/plan_settings.py), from plans on fixtures."""

from __future__ import annotations

import pytest

from capacity import memory
from capacity.plan_settings import (
    MAX_BATCHED_TOKENS,
    MIN_BATCHED_TOKENS,
    batched_tokens,
    knee_tokens,
    plan_settings,
)
from capacity.planner import PlanInputs, plan
from tests.unit.capacity.test_planner import LLAMA3_8B


def _plan(gpu="H100-SXM", **kw):
    args = dict(
        model_config=LLAMA3_8B,
        gpu=gpu,
        avg_input_tokens=1000,
        avg_output_tokens=200,
        max_model_len=8192,
        peak_qps=50,
    )
    args.update(kw)
    return plan(PlanInputs(**args))


def test_engine_limits_come_from_the_budget_table():
    p = _plan()
    s = plan_settings(p)
    assert s.max_num_seqs == p.max_concurrency_avg  # KV holds this many average requests
    assert s.min_num_seqs == p.max_concurrency_max_len  # ... and this many full-length ones
    assert 1 <= s.min_num_seqs <= s.max_num_seqs
    assert (s.max_model_len, s.block_size_tokens) == (8192, 16)
    assert s.gpu_memory_utilization == 0.9
    assert s.kv_cache_bytes is None and s.planned_kv_bytes == p.split.kv_region_bytes
    assert plan_settings(p, pin_kv_bytes=True).kv_cache_bytes == p.split.kv_region_bytes
    assert (s.hot_replicas, s.cold_max_replicas) == (p.hot_replicas, p.cold_max_replicas)
    assert s.replica_capacity_rps == pytest.approx(p.replica_requests_per_s, rel=1e-3)


def test_knee_is_where_weight_reads_equal_compute():
    p = _plan()
    gpu = p.inputs.spec
    knee = knee_tokens(p)
    # at the knee, reading the weights once takes as long as computing `knee` tokens
    weights_s = p.split.weight_bytes / gpu.bandwidth_bytes_per_s
    compute_s = 2 * p.num_params * knee / gpu.bf16_flops_per_s
    assert compute_s == pytest.approx(weights_s, rel=0.01)
    assert knee == 296  # H100 SXM bf16: 2 B x 989 TFLOP/s / (2 x 3.35 TB/s)


def test_token_budget_holds_the_decodes_plus_a_knee_as_a_power_of_two():
    p = _plan()
    b = batched_tokens(p, 300)
    assert b == 1024 and b >= 300 + knee_tokens(p) and b & (b - 1) == 0
    assert batched_tokens(p, 1) == 512
    assert batched_tokens(p, 1_000_000) == MAX_BATCHED_TOKENS
    assert batched_tokens(p, 1) >= MIN_BATCHED_TOKENS


def test_settings_validate_as_an_engine_config():
    from serving.engine.config import EngineConfig

    for gpu in ("H100-SXM", "L4", "H200"):
        s = plan_settings(_plan(gpu, max_model_len=4096))
        cfg = EngineConfig(**s.engine_values())
        assert cfg.max_num_seqs == s.max_num_seqs
        assert memory.blocks_for_tokens(4096, 16) * 16 == 4096


def test_a_measured_profile_sets_the_replicas_and_the_capacity():
    p = _plan()  # peak 50 QPS, hot fraction 0.7
    s = plan_settings(p, measured_rps=10.0)
    assert (s.hot_replicas, s.cold_max_replicas, s.replica_capacity_rps) == (4, 1, 10.0)
    assert s.max_num_seqs == p.max_concurrency_avg  # the memory side stays the budget table's
