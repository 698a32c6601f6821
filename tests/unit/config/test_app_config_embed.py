"""An embedding app's config: the sections only an LLM app reads are refused by name."""

from __future__ import annotations

import pytest

from serving.config import AppConfig


@pytest.mark.parametrize(
    "section",
    [
        {"engine": {"max_num_seqs": 8}},
        {"tiers": {"offline": {"max_waiting": 1}}},
        {"controller": {}},
        {"pools": {"cold": {"max_replicas": 2}}},
    ],
)
def test_an_embed_app_refuses_the_sections_only_an_llm_app_reads(section):
    name = next(iter(section))
    with pytest.raises(ValueError, match=rf"^{name}.*applies only to model.task: generate"):
        AppConfig.from_args({"model": {"task": "embed"}, **section})


def test_an_embed_app_round_trips_without_llm_sections():
    cfg = AppConfig.from_args({"model": {"task": "embed"}, "pools": {"hot": {"num_replicas": 2}}})
    plain = cfg.to_dict()
    assert not {"engine", "tiers", "controller"} & set(plain) and "cold" not in plain["pools"]
    assert AppConfig.from_args(plain) == cfg
