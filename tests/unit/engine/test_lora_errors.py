"""Adapters that cannot be served are refused by name; a slot a running request uses is never
evicted (the request of another adapter waits for it instead)."""

from __future__ import annotations

import json

import pytest

from serving.engine import EngineConfig, LLMEngine, SamplingParams
from serving.engine.sequence import SeqStatus
from serving.tiny_adapters import save_random_lora
from serving.tiny_models import tiny_model


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-errors")
    return {
        "a": save_random_lora(tiny_model("llama"), root / "a", rank=4, seed=1, b_std=0.05),
        "b": save_random_lora(tiny_model("llama"), root / "b", rank=4, seed=2, b_std=0.05),
        "r16": save_random_lora(tiny_model("llama"), root / "r16", rank=16, seed=3),
        "wide": save_random_lora(tiny_model("llama", hidden_size=32), root / "wide", rank=4),
        "head": save_random_lora(
            tiny_model("llama"), root / "head", rank=4, target_modules=("q_proj", "lm_head")
        ),
    }


def _engine(**overrides) -> LLMEngine:
    cfg = dict(num_kv_blocks=200, block_size_tokens=8, max_loras=1, max_lora_rank=8)
    return LLMEngine(tiny_model("llama"), config=EngineConfig(**{**cfg, **overrides}))


def _edited_copy(src, dst, **changes):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    data = json.loads((dst / "adapter_config.json").read_text())
    data.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(data))
    return dst


def test_unknown_adapter_is_refused_naming_it_and_the_loaded_ones(adapter_dirs):
    engine = _engine()
    engine.add_adapter("a", str(adapter_dirs["a"]))
    loaded = r"adapter='nope' is not loaded on this engine; loaded: \['a'\]"
    with pytest.raises(ValueError, match=loaded):
        engine.add_request([5, 6, 7], SamplingParams(max_tokens=2), adapter="nope")


def test_adapter_on_an_engine_without_slots_is_refused(adapter_dirs):
    engine = _engine(max_loras=0)
    with pytest.raises(ValueError, match=r"adapter='a'.*max_loras=0"):
        engine.add_request([5, 6, 7], adapter="a")
    with pytest.raises(ValueError, match="max_loras >= 1"):
        engine.add_adapter("a", str(adapter_dirs["a"]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"use_dora": True}, r"use_dora=True is not supported"),
        ({"modules_to_save": ["lm_head"]}, r"modules_to_save=\['lm_head'\] is not supported"),
        ({"bias": "all"}, r"bias='all' is not supported; allowed: 'none'"),
        ({"lora_bias": True}, r"lora_bias=True is not supported"),
        ({"alpha_pattern": {"q_proj": 4}}, r"alpha_pattern=\{'q_proj': 4\} is not supported"),
        ({"peft_type": "IA3"}, r"peft_type='IA3' is not supported; allowed: 'LORA'"),
        ({"r": 0}, r"r=0 must be an integer >= 1"),
        ({"some_future_option": 3}, r"some_future_option=3 is a PEFT option tideserve does not"),
    ],
)
def test_bad_adapter_config_is_refused_naming_field_and_value(
    adapter_dirs, tmp_path, changes, message
):
    path = _edited_copy(adapter_dirs["a"], tmp_path / "bad", **changes)
    with pytest.raises(ValueError, match=message):
        _engine().add_adapter("bad", str(path))


def test_rank_over_max_lora_rank_is_refused_with_the_fix(adapter_dirs):
    with pytest.raises(ValueError, match=r"rank 16 of .* exceeds EngineConfig.max_lora_rank=8"):
        _engine().add_adapter("big", str(adapter_dirs["r16"]))


def test_adapter_of_another_base_model_is_refused_by_shape(adapter_dirs):
    shapes = r"lora_A \(4, \d+\).*this model needs \[r, \d+\].*another base model"
    with pytest.raises(ValueError, match=shapes):
        _engine().add_adapter("wide", str(adapter_dirs["wide"]))


def test_adapter_on_a_non_projection_module_is_refused(adapter_dirs):
    # PEFT saves the targeted lm_head's base weight too: refused as a non-LoRA weight
    head = r"weight 'base_model\.model\.lm_head\..*tideserve loads LoRA on \['q_proj'"
    with pytest.raises(ValueError, match=head):
        _engine().add_adapter("head", str(adapter_dirs["head"]))


def test_missing_directory_and_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        _engine().add_adapter("x", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"has no adapter_config\.json"):
        _engine().add_adapter("x", str(tmp_path))


def test_engine_config_validates_the_slot_keys():
    with pytest.raises(ValueError, match=r"EngineConfig.max_loras=-1 is out of range"):
        EngineConfig(max_loras=-1)
    with pytest.raises(ValueError, match=r"EngineConfig.max_lora_rank=0 is out of range"):
        EngineConfig(max_lora_rank=0)


def test_a_pinned_adapter_is_never_evicted_the_other_waits(adapter_dirs):
    engine = _engine(max_loras=1)
    engine.add_adapter("a", str(adapter_dirs["a"]))
    engine.add_adapter("b", str(adapter_dirs["b"]))
    twelve = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    long_a = engine.add_request([5, 6, 7], twelve, adapter="a")
    engine.step()
    wait_b = engine.add_request([8, 9], SamplingParams(max_tokens=2, temperature=0), adapter="b")
    base = engine.add_request([8, 9], SamplingParams(max_tokens=2, temperature=0))
    pool = engine.adapters.pool
    seqs = {}
    while engine.has_unfinished():
        for seq in engine.step():
            seqs[seq.request_id] = seq
        engine.check_integrity()
        a_running = any(s.request_id == long_a for s in engine.scheduler.running)
        if a_running:
            assert pool.slot_of == {"a": 0}, "the slot of a running request's adapter changed"
            waiting = [s for q in engine.scheduler.waiting.values() for s in q]
            assert any(s.request_id == wait_b and s.status is SeqStatus.WAITING for s in waiting)
    assert seqs[wait_b].admitted_s is not None and seqs[wait_b].finished
    assert seqs[long_a].num_output_tokens == 12
    assert pool.num_evictions == 1 and pool.slot_of == {"b": 0}
    assert base in seqs


def test_remove_adapter_refuses_while_a_request_uses_it(adapter_dirs):
    engine = _engine()
    engine.add_adapter("a", str(adapter_dirs["a"]))
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3), adapter="a")
    with pytest.raises(ValueError, match="'a' is in use"):
        engine.remove_adapter("a")
    while engine.has_unfinished():
        engine.step()
    engine.remove_adapter("a")
    with pytest.raises(ValueError, match="not loaded"):
        engine.add_request([5], adapter="a")
