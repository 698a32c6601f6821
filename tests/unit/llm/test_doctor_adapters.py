"""`tideserve doctor` names LoRA adapter thrashing as the cause of slow first tokens when it is
(serving/llm/doctor_adapters.py), and only then."""

from __future__ import annotations

from serving.config import AppConfig
from serving.llm.doctor import diagnose
from serving.llm.messages import LoraCounts
from tests.unit.llm.test_doctor import reading, win

LORA = AppConfig.from_args({"engine": {"max_num_seqs": 16, "min_num_seqs": 4, "max_loras": 4}})
SLOW_FIRST_TOKENS = win(ttft_p99_s={"interactive": 0.9})  # 0.9x the 1 s SLO: past half of it


THRASHING = LoraCounts(admissions=40, loads=24, evictions=20)


def lora_reading(window=SLOW_FIRST_TOKENS, counts=THRASHING, pool="hot"):
    return reading(pool, window=window, config=LORA, lora_slots_total=4, lora_window=counts)


def test_thrashing_with_slow_first_tokens_is_the_verdict_and_names_max_loras():
    v = diagnose([lora_reading()])
    assert v.cause == "adapter_thrashing"
    assert (v.knob, v.change) == ("engine.max_loras", "4 -> 8")
    assert "60% of LoRA requests" in v.summary and "first tokens wait" in v.summary
    adapters = next(f for f in v.findings if f.check == "adapters")
    assert "24 loads (0.60 per request), 20 evictions on 4 slots" in adapters.evidence[0]


def test_thrashing_while_first_tokens_are_fast_only_warns():
    v = diagnose([lora_reading(window=win())])  # TTFT p99 0.3x the SLO
    adapters = next(f for f in v.findings if f.check == "adapters")
    assert adapters.status == "warn" and adapters.knob is None
    assert v.cause == "adapter_thrashing" and v.knob is None


def test_slots_filling_for_the_first_time_are_not_thrashing():
    # every load went into a free slot: no eviction, whatever the share of loads
    v = diagnose([lora_reading(counts=LoraCounts(8, 4, 0))])
    assert v.cause != "adapter_thrashing"
    assert next(f for f in v.findings if f.check == "adapters").cause == "adapters_ok"


def test_requests_waiting_on_pinned_slots_are_thrashing_too():
    pinned = win(ttft_p99_s={"interactive": 0.9}, adapter_bound=0.4)
    v = diagnose([lora_reading(window=pinned, counts=LoraCounts(40, 2, 1))])
    assert v.cause == "adapter_thrashing" and v.knob == "engine.max_loras"


def test_few_loads_per_request_are_healthy_and_no_slots_means_no_check():
    v = diagnose([lora_reading(counts=LoraCounts(100, 5, 3))])
    assert next(f for f in v.findings if f.check == "adapters").status == "ok"
    plain = diagnose([reading()])
    assert next(f for f in plain.findings if f.check == "adapters").cause == "no_adapters"


def test_config_drift_still_comes_first():
    drifted = AppConfig.from_args({"engine": {"max_num_seqs": 8, "min_num_seqs": 4}})
    cold = reading("cold", config=drifted, fingerprint=drifted.replica_fingerprint())
    assert diagnose([lora_reading(), cold]).cause == "config_drift"
