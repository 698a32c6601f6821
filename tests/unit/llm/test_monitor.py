"""A replica's periodic duties (serving/llm/monitor.py) on a real tiny engine with a fake clock:
the tuner in the loop with its moves exported, the step window doctor reads, the reading."""

from __future__ import annotations

from serving.config import AppConfig
from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.llm import metrics as m
from serving.llm import monitor as mon
from serving.tiny_models import tiny_model
from tests.unit.llm.test_metrics import fake_metrics

ENGINE = dict(num_kv_blocks=128, block_size_tokens=8, max_model_len=256, max_num_seqs=2)


def _engine(tokenizer, clock) -> LLMEngine:
    cfg = EngineConfig(**ENGINE, min_num_seqs=1)
    return LLMEngine(tiny_model("llama", seed=2), tokenizer, cfg, clock=clock)


def test_monitor_tunes_rotates_its_window_and_reads(tokenizer, clock):
    config = AppConfig.from_args(
        {"engine": {**ENGINE, "min_num_seqs": 1, "tuner": True, "tuner_interval_s": 1.0}}
    )
    engine = _engine(tokenizer, clock)
    metrics, made = fake_metrics()
    monitor = mon.ReplicaMonitor(engine, config, metrics, clock())
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for _ in range(16):
        engine.add_request([5, 6, 7, 8], params)
    while engine.has_unfinished():
        clock.advance(0.25)
        engine.step()
        monitor.tick(clock())
    moves = [move for _, move in monitor.tuner.moves]
    assert moves and made[m.TUNER_MOVES].total == len(moves)
    assert any(move.action == "raise" for move in moves)  # the cap of 2 bound: it grew
    assert engine.config.max_num_seqs == moves[-1].max_num_seqs
    clock.advance(mon.WINDOW_S)
    monitor.tick(clock())  # a step window closes every WINDOW_S
    assert monitor.last_window is not None and monitor.last_window.num_completions > 0
    reading = monitor.reading("hot", "replica-1", "abc")
    assert (reading.pool, reading.replica_id, reading.fingerprint) == ("hot", "replica-1", "abc")
    assert reading.max_num_seqs == engine.config.max_num_seqs
    assert reading.kv_blocks_total == 128 and reading.kv_bytes_per_token > 0
    assert reading.tuner_last is not None and reading.config is config
    assert reading.gpus == ()  # num_gpus 0: NVML is never asked


def test_window_requests_count_the_first_tokens_of_the_last_closed_window(tokenizer, clock):
    engine = _engine(tokenizer, clock)
    monitor = mon.ReplicaMonitor(engine, AppConfig.from_args({}), fake_metrics()[0], clock())
    assert monitor.window_requests == 0  # no window closed yet
    for _ in range(3):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=2, temperature=0))
    while engine.has_unfinished():
        clock.advance(0.1)
        engine.step()
    clock.advance(mon.WINDOW_S)
    monitor.tick(clock())
    assert monitor.window_requests == 3  # the per-request basis of the adapter-load cost
    assert monitor.lora_window.load_s == 0.0  # an engine without adapters loads none


def test_no_tuner_unless_configured(tokenizer, clock):
    engine = _engine(tokenizer, clock)
    monitor = mon.ReplicaMonitor(engine, AppConfig.from_args({}), fake_metrics()[0], clock())
    added = [o for o in engine.observers if o is not engine._driver._pacer]  # the engine's own
    assert monitor.tuner is None and added == [monitor.window]
    assert monitor.reading("cold", "r", "f").tuner_last is None


def test_step_delay_fault_slows_every_scheduled_token(tokenizer, clock, monkeypatch):
    slept = []
    monkeypatch.setenv(mon.STEP_DELAY_ENV, "0.002")
    monkeypatch.setattr(mon.time, "sleep", slept.append)
    engine = _engine(tokenizer, clock)
    mon.ReplicaMonitor(engine, AppConfig.from_args({}), fake_metrics()[0], clock())
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert slept == [0.002 * 3, 0.002 * 1]  # the 3-token prefill, then one decode
