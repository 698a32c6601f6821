"""`tideserve doctor`'s verdicts on constructed readings (serving/llm/doctor.py): R10's triage
order, the cause named, and the knob with how much to turn it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from capacity.probe import GpuSample
from serving.config import AppConfig
from serving.engine.window import WindowSummary
from serving.llm.doctor import diagnose, format_verdict
from serving.llm.messages import ReplicaReading

CONFIG = AppConfig.from_args({"engine": {"max_num_seqs": 16, "min_num_seqs": 4}})

QUIET = WindowSummary(
    span_s=5.0, num_steps=100, busy_s=2.0, num_first_tokens=20, num_gaps=400, output_tokens=420,
    num_arrivals=20, num_completions=20, waiting_start=0, waiting_end=0, ceiling_bound=0.0,
    budget_bound=0.0, kv_bound=0.0, prefill_fraction=0.3, mean_tokens_per_step=12.0,
    step_fixed_s=0.015, step_per_token_s=0.0005, avg_request_tokens=300.0, kv_admissible_seqs=40,
    ttft_p99_s={"interactive": 0.3}, itl_p99_s={"interactive": 0.03},
    queue_wait_p99_s={"interactive": 0.01},
)  # fmt: skip


def reading(pool="hot", window=QUIET, config=CONFIG, **kw) -> ReplicaReading:
    base = dict(
        pool=pool,
        replica_id=f"{pool}-1",
        fingerprint=config.replica_fingerprint(),
        config=config,
        kv_blocks_total=800,  # 12800 tokens: 40 requests of 300 (19 blocks each -> 42)
        kv_blocks_used=100,
        kv_blocks_reserved=200,
        block_size_tokens=16,
        kv_bytes_per_token=23040,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        concurrency_limit=16,
        num_running=4,
        num_waiting=0,
        avg_seq_len_tokens=150.0,
        num_preemptions=0,
        num_timeouts=0,
        window=window,
    )
    base.update(kw)
    return ReplicaReading(**base)


def win(**kw) -> WindowSummary:
    return dataclasses.replace(QUIET, **kw)


def test_healthy():
    v = diagnose([reading(), reading("cold")])
    assert v.cause == "healthy" and v.knob is None
    assert [f.status for f in v.findings] == ["ok"] * 5
    assert [f.check for f in v.findings] == ["config", "memory", "adapters", "queue", "compute"]
    assert dict(v.num_replicas) == {"hot": 1, "cold": 1}


def test_no_replicas():
    assert diagnose([]).cause == "no_replicas"


def test_hot_and_cold_configs_that_differ_come_first_and_name_the_keys():
    drifted = AppConfig.from_args({"engine": {"max_num_seqs": 8, "min_num_seqs": 4}})
    # the cold pool also has a KV problem: config consistency is still triaged first (R10)
    v = diagnose([reading(), reading("cold", config=drifted, kv_blocks_total=40, num_waiting=5)])
    assert v.cause == "config_drift"
    assert "engine.max_num_seqs" in v.summary and v.knob == "pools.cold"
    assert "engine.max_num_seqs: hot 16, cold 8" in v.findings[0].evidence


def test_kv_budget_too_small_for_the_concurrency():
    # 40 blocks = 640 tokens: two 300-token requests, under a cap of 16
    r = reading(kv_blocks_total=40, kv_blocks_reserved=38, num_waiting=6, window=win(kv_bound=0.8))
    v = diagnose([r])
    assert v.cause == "kv_budget" and v.knob == "engine.max_num_seqs" and v.change == "16 -> 2"
    assert "holds 2 of the average 300 tokens" in v.summary
    memory = v.findings[1]
    assert any("7.50x the KV capacity" in e for e in memory.evidence)
    assert any("raise engine.kv_cache_bytes 14.1 MiB -> 106.9 MiB" in e for e in memory.evidence)


def test_cap_above_the_kv_budget_without_symptoms_is_an_early_warning():
    v = diagnose([reading(kv_blocks_total=40, kv_blocks_used=5, kv_blocks_reserved=10)])
    assert v.cause == "kv_watermark" and v.findings[1].status == "warn" and v.knob is None


def test_a_queue_that_grows_because_arrivals_exceed_capacity():
    busy = win(
        busy_s=5.0, num_arrivals=60, num_completions=20, waiting_start=4, waiting_end=30,
        ceiling_bound=0.9, queue_wait_p99_s={"interactive": 2.5},
        step_fixed_s=0.001, step_per_token_s=0.005, mean_tokens_per_step=16.0,
    )  # fmt: skip
    v = diagnose([reading(window=busy, num_waiting=30, num_running=16)])
    assert v.cause == "arrivals_exceed_capacity"
    # 12 arrivals/s against 4 completions/s per busy replica: 3 replicas, so +2
    assert v.knob == "pools.hot.num_replicas" and v.change == "+2 (1 -> 3)"
    assert "not a smaller batch" in v.summary


def test_a_queue_at_a_cap_that_has_room_raises_the_cap_instead():
    capped = win(
        busy_s=5.0, num_arrivals=60, num_completions=20, waiting_start=4, waiting_end=30,
        ceiling_bound=0.9, queue_wait_p99_s={"interactive": 2.5},
        step_fixed_s=0.02, step_per_token_s=0.0001, mean_tokens_per_step=16.0,
    )  # fmt: skip
    v = diagnose([reading(window=capped, num_waiting=30)])
    assert v.cause == "concurrency_cap"
    assert v.knob == "engine.max_num_seqs" and v.change == "16 -> 32"


def test_steps_too_long_for_the_inter_token_slo():
    slow = win(itl_p99_s={"interactive": 0.9}, prefill_fraction=0.8)
    v = diagnose([reading(window=slow)])
    assert v.cause == "batch_too_big"
    assert (v.knob, v.change) == ("engine.max_num_batched_tokens", "512 -> 256")
    decode_heavy = win(itl_p99_s={"interactive": 0.9}, prefill_fraction=0.1)
    v = diagnose([reading(window=decode_heavy)])
    assert (v.knob, v.change) == ("engine.max_num_seqs", "16 -> 8")


def test_no_window_yet_is_not_a_failure():
    v = diagnose([reading(window=None)])
    assert v.cause == "healthy"
    assert "no step window" in v.findings[3].summary


def test_text_and_json_outputs():
    gpu = GpuSample(0, "NVIDIA H200", 100 * 2**30, 141 * 2**30, 35.0, 410.0)
    v = diagnose([reading(gpus=(gpu,))])
    text = format_verdict(v, "tideserve")
    assert text.splitlines()[0] == "tideserve doctor: app 'tideserve', replicas: hot 1"
    assert "[ok  ] config" in text and "GPU 0 utilisation 35%" in text
    as_json = json.loads(json.dumps(v.to_dict()))
    assert as_json["cause"] == "healthy" and len(as_json["findings"]) == 5


@pytest.mark.parametrize("argv", [["doctor", "--help"]])
def test_doctor_is_a_tideserve_command(argv, capsys):
    from tideserve.cli import COMMANDS, main

    assert "doctor" in COMMANDS
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "--json" in capsys.readouterr().out


def test_the_prefix_cache_hit_rate_is_shown_per_pool():
    from serving.llm.doctor_checks import check_compute

    readings = [
        reading(prefix_cache_query_tokens=1000, prefix_cache_hit_tokens=600),
        reading(prefix_cache_query_tokens=1000, prefix_cache_hit_tokens=200),
        reading(pool="cold"),  # nothing looked up yet: no line
    ]
    evidence = check_compute(readings).evidence
    assert "hot: prefix cache hit rate 40% (800 of 2000 prompt tokens not prefilled)" in evidence
    assert not any(line.startswith("cold: prefix") for line in evidence)
