"""vLLM's LoRA endpoint bodies (serving/api/lora.py): strict, and what is not implemented is a
400 naming it."""

from __future__ import annotations

import pytest

from serving.api.errors import ApiError
from serving.api.http import model_list, validate
from serving.api.lora import LoadLoraAdapterRequest, UnloadLoraAdapterRequest


def test_vllms_load_and_unload_bodies_validate():
    body = validate(LoadLoraAdapterRequest, {"lora_name": "sql", "lora_path": "/adapters/sql"})
    assert (body.lora_name, body.lora_path) == ("sql", "/adapters/sql")
    assert validate(UnloadLoraAdapterRequest, {"lora_name": "sql"}).lora_name == "sql"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"lora_name": "x"}, "lora_path"),
        ({"lora_name": "x", "lora_path": 3}, "lora_path"),
        ({"lora_name": "x", "lora_path": "/p", "base_model": "y"}, "base_model: unknown field"),
        ({"lora_name": "x", "lora_path": "/p", "load_inplace": True}, "load_inplace"),
        ({"lora_name": "x", "lora_path": "/p", "is_3d_lora_weight": True}, "is_3d_lora_weight"),
    ],
)
def test_bad_load_bodies_are_400s_naming_the_field(body, says):
    with pytest.raises(ApiError, match=says) as err:
        validate(LoadLoraAdapterRequest, body)
    assert err.value.status == 400


def test_model_list_puts_the_base_first_then_the_adapter_cards():
    cards = [{"id": "sql", "object": "model", "parent": "tiny"}]
    listed = model_list("tiny", cards)
    assert [m["id"] for m in listed["data"]] == ["tiny", "sql"]
    assert model_list("tiny")["data"][0]["id"] == "tiny"
