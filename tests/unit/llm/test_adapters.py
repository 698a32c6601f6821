"""The ingress's adapter registry (serving/llm/adapters.py): what a request's `model` may name,
/v1/models' cards, and vLLM's load/unload checks with their statuses."""

from __future__ import annotations

import pytest

from serving.api.errors import ApiError
from serving.llm.adapters import AdapterRegistry
from serving.llm.messages import DECLARED, AdapterRef


def registry(max_loras: int = 4) -> AdapterRegistry:
    return AdapterRegistry("tiny", {"sql": "/adapters/sql"}, max_loras)


def test_model_names_the_base_or_a_served_adapter():
    reg = registry()
    assert reg.resolve("tiny") is None and reg.resolve(None) is None and reg.resolve("") is None
    assert reg.resolve("sql") == AdapterRef("sql", "/adapters/sql", DECLARED)


def test_an_unknown_model_is_a_404_naming_it_and_what_is_served():
    with pytest.raises(ApiError) as err:
        registry().resolve("gpt-5")
    assert err.value.status == 404 and err.value.code == "model_not_found"
    assert "'gpt-5'" in err.value.message and "['tiny', 'sql']" in err.value.message


def test_models_lists_adapters_with_the_base_as_parent():
    reg = registry()
    ref = reg.begin_load("chat", "/adapters/chat")
    reg.finish_load(ref, ok=True)
    cards = reg.cards()
    assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
        ("chat", "tiny", "/adapters/chat"),
        ("sql", "tiny", "/adapters/sql"),
    ]
    assert all(c["object"] == "model" for c in cards)


def test_a_load_is_served_only_once_a_replica_accepted_it():
    reg = registry()
    ref = reg.begin_load("chat", "/adapters/chat")
    with pytest.raises(ApiError, match="does not exist"):
        reg.resolve("chat")  # validated on a replica first
    reg.finish_load(ref, ok=False)  # the replica refused it
    with pytest.raises(ApiError):
        reg.resolve("chat")
    again = reg.begin_load("chat", "/adapters/chat")  # the name is free again
    reg.finish_load(again, ok=True)
    assert reg.resolve("chat") == again and again.load_id != ref.load_id


@pytest.mark.parametrize(
    ("name", "path", "says"),
    [
        ("", "/p", "Both 'lora_name' and 'lora_path'"),
        ("x", " ", "Both 'lora_name' and 'lora_path'"),
        ("tiny", "/p", "conflicts with a served base model"),
        ("sql", "/p", "has already been loaded"),
    ],
)
def test_bad_loads_are_400s_saying_why(name, path, says):
    with pytest.raises(ApiError, match=says) as err:
        registry().begin_load(name, path)
    assert err.value.status == 400


def test_a_name_being_validated_cannot_be_loaded_twice():
    reg = registry()
    reg.begin_load("chat", "/a")
    with pytest.raises(ApiError, match="already been loaded"):
        reg.begin_load("chat", "/b")


def test_an_app_without_lora_slots_refuses_loads_naming_the_setting():
    with pytest.raises(ApiError, match=r"engine\.max_loras is 0") as err:
        AdapterRegistry("tiny", {}, 0).begin_load("chat", "/a")
    assert err.value.status == 400


def test_unload_stops_serving_the_name_and_unknown_names_are_404():
    reg = registry()
    assert reg.unload("sql").path == "/adapters/sql"
    with pytest.raises(ApiError) as err:
        reg.resolve("sql")
    assert err.value.status == 404
    with pytest.raises(ApiError, match="cannot be found") as err:
        reg.unload("sql")
    assert err.value.status == 404
    with pytest.raises(ApiError, match="needs to be provided") as err:
        reg.unload("")
    assert err.value.status == 400
