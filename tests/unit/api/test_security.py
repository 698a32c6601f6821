"""Security defaults that need no Ray: a model directory's own code never runs unless the
operator opted in, and the API key check is strict about its scheme and constant-time."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from serving.api.errors import ApiError
from serving.api.http import check_api_key
from serving.engine import loader

EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("remote code ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = "tideserve_evil"
"""


def evil_model_dir(tmp_path):
    """A model directory whose config points at its own Python file, as hub repos with custom
    architectures do; importing that file leaves a marker."""
    model_dir, marker = tmp_path / "evil", tmp_path / "marker.txt"
    model_dir.mkdir()
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    config = {"model_type": "tideserve_evil", "auto_map": auto_map}
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    return model_dir, marker


def test_model_code_does_not_run_by_default(tmp_path):
    model_dir, marker = evil_model_dir(tmp_path)
    with pytest.raises(ValueError, match="trust_remote_code"):
        loader.load_model(model_dir, torch.float32, torch.device("cpu"))
    assert not marker.exists()


def test_model_code_runs_only_when_the_operator_opts_in(tmp_path):
    model_dir, marker = evil_model_dir(tmp_path)
    with pytest.raises(Exception):  # noqa: B017 - the stub has no model class; the import is the point
        loader.load_model(model_dir, torch.float32, torch.device("cpu"), trust_remote_code=True)
    assert marker.read_text() == "remote code ran"


def request_with(authorization: str | None):
    headers = {} if authorization is None else {"authorization": authorization}
    return SimpleNamespace(headers=headers)


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong", "Bearer sk-secre", "Bearer sk-secret2", "sk-secret",
     "Basic sk-secret", "Bearer  sk-secretx"],
)  # fmt: skip
def test_a_wrong_missing_or_unschemed_key_is_a_401(authorization):
    with pytest.raises(ApiError) as info:
        check_api_key("sk-secret", request_with(authorization))
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


@pytest.mark.parametrize("authorization", ["Bearer sk-secret", "bearer sk-secret"])
def test_the_right_key_passes_and_no_key_configured_means_open(authorization):
    check_api_key("sk-secret", request_with(authorization))
    check_api_key(None, request_with(None))
