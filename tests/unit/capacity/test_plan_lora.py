"""LoRA slots in the capacity plan: `plan --max-loras N` sets the slots' bytes aside before the
KV region, as a replica allocates them at start, and writes engine.max_loras with the plan."""

from __future__ import annotations

import pytest

from capacity import memory
from capacity.adapters import lora_slot_bytes
from capacity.plan_settings import plan_settings
from capacity.planner import PlanInputs, format_plan, model_view, plan
from tests.unit.capacity.test_planner import LLAMA3_8B, inputs


def test_the_slots_come_out_of_the_kv_region_byte_for_byte():
    base, with_slots = plan(inputs()), plan(inputs(max_loras=22, max_lora_rank=16))
    slots = lora_slot_bytes(model_view(LLAMA3_8B), "bf16", 22, 16)
    assert with_slots.split.lora_slot_bytes == slots > 0
    page = memory.block_bytes(model_view(LLAMA3_8B), "bf16", 16)
    # KV is whole blocks: it loses the slots' bytes rounded to a block, never less
    lost = base.split.kv_region_bytes - with_slots.split.kv_region_bytes
    assert slots <= lost < slots + page
    assert with_slots.max_concurrency_avg <= base.max_concurrency_avg
    assert with_slots.memory_watermark == pytest.approx(base.memory_watermark, abs=page / 80e9)


def test_the_budget_table_the_dict_and_the_cluster_yaml_values_name_the_slots():
    p = plan(inputs(max_loras=8, max_lora_rank=32))
    assert "LoRA slots (8 x rank 32, engine.max_loras)" in format_plan(p)
    d = p.to_dict()
    assert (d["max_loras"], d["max_lora_rank"], d["lora_slot_bytes"]) == (
        8,
        32,
        p.split.lora_slot_bytes,
    )
    engine = plan_settings(p).engine_values()
    assert (engine["max_loras"], engine["max_lora_rank"]) == (8, 32)


def test_without_slots_nothing_changes():
    p = plan(inputs())
    assert p.split.lora_slot_bytes == 0 and "LoRA" not in format_plan(p)
    assert "max_loras" not in plan_settings(p).engine_values()


@pytest.mark.parametrize(
    "field, value", [("max_loras", -1), ("max_loras", 1.5), ("max_lora_rank", 0)]
)
def test_bad_slot_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        small = dict(avg_input_tokens=1, avg_output_tokens=1, max_model_len=64, peak_qps=1.0)
        PlanInputs(model_config=LLAMA3_8B, gpu="H100-SXM", **small, **{field: value})


def test_the_cli_takes_max_loras(capsys, tmp_path):
    import json

    from capacity import cli

    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    argv = ["plan", "--model", str(tmp_path), "--gpu", "h100", "--avg-input", "600",
            "--avg-output", "120", "--max-model-len", "8192", "--peak-qps", "10"]  # fmt: skip
    assert cli.main([*argv, "--json", "--max-loras", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_loras"] == 4 and out["lora_slot_bytes"] > 0
