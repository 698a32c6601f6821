"""The `model` section's LoRA adapters (serving/config/model.py): name -> local path, validated
without touching the disk, fail closed, part of the replicas' fingerprint."""

from __future__ import annotations

import pickle

import pytest

from serving.config import AppConfig

LORA = {"engine": {"max_loras": 2}}


def args(adapters, **model):
    return {"model": {"adapters": adapters, **model}, **LORA}


def test_adapters_map_names_to_paths_and_round_trip():
    cfg = AppConfig.from_args(args({"sql": "/adapters/sql", "chat": "/adapters/chat"}))
    assert dict(cfg.model.adapters) == {"sql": "/adapters/sql", "chat": "/adapters/chat"}
    assert AppConfig.from_args(cfg.to_dict()) == cfg
    assert pickle.loads(pickle.dumps(cfg.model)) == cfg.model
    assert AppConfig.from_args({}).model.adapters == {}


def test_adapters_are_in_the_replicas_fingerprint():
    one = AppConfig.from_args(args({"sql": "/a"}))
    other = AppConfig.from_args(args({"sql": "/b"}))
    assert one.replica_fingerprint() != other.replica_fingerprint()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (["sql"], r"model.adapters=\['sql'\] must be a mapping"),
        ({"": "/a"}, "model.adapters key '' must be a non-empty name"),
        ({" sql": "/a"}, "without surrounding spaces"),
        ({"sql": 3}, "model.adapters.sql=3 must be a local adapter directory"),
        ({"sql": ""}, "model.adapters.sql='' must be"),
    ],
)
def test_bad_adapters_are_errors_naming_the_key(value, says):
    with pytest.raises(ValueError, match=says):
        AppConfig.from_args(args(value))


def test_an_adapter_named_like_the_base_model_is_refused():
    with pytest.raises(ValueError, match=r"model\.adapters\.tiny: the name is model\.served_name"):
        AppConfig.from_args(args({"tiny": "/a"}, served_name="tiny"))


def test_adapters_need_lora_slots():
    with pytest.raises(ValueError, match=r"engine.max_loras=0: set engine.max_loras >= 1"):
        AppConfig.from_args({"model": {"adapters": {"sql": "/a"}}})


def test_an_embedding_app_refuses_adapters():
    with pytest.raises(ValueError, match=r"model\.adapters applies only to model\.task: generate"):
        AppConfig.from_args({"model": {"task": "embed", "adapters": {"sql": "/a"}}})
