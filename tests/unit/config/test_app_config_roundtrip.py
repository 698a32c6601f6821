"""The application config as data: it round-trips through dicts, JSON and pickle, is frozen,
and its replica fingerprint covers exactly what hot and cold replicas share."""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path

import pytest

from serving.config import AppConfig, load_cluster_yaml
from serving.config.sections import DEFAULT_TIERS
from serving.engine.config import EngineConfig

CLUSTER_YAML = Path(__file__).resolve().parents[3] / "cluster.yaml"


def _custom() -> AppConfig:
    return AppConfig.from_args(
        {
            "model": {"source": "/models/x", "served_name": "x", "trust_remote_code": True},
            "engine": {"kv_mode": "on_demand", "max_num_seqs": 8, "min_num_seqs": 2},
            "tiers": {"analytical": {"max_waiting": 3}},
            "pools": {"hot": {"num_replicas": 2, "resources": {"pool_hot": 1}}},
            "replica": {"num_gpus": 0.5, "max_queued_requests": -1},
            "server": {"api_key_env": "KEY"},
            "controller": {"lead_overrides": [{"start": "07:00", "end": "09:00", "lead_s": 60}]},
        }
    )


@pytest.mark.parametrize("make", [AppConfig, lambda: load_cluster_yaml(CLUSTER_YAML), _custom])
def test_to_dict_round_trips_through_from_args_json_and_pickle(make):
    import json

    cfg = make()
    plain = cfg.to_dict()
    assert json.loads(json.dumps(plain)) == plain
    assert AppConfig.from_args(plain) == cfg
    assert AppConfig.from_args(json.loads(json.dumps(plain))) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert pickle.loads(pickle.dumps(cfg.pools)) == cfg.pools


def test_config_is_frozen():
    cfg = _custom()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.engine = EngineConfig()  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.tiers["offline"] = DEFAULT_TIERS["offline"]  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.pools.hot.resources["x"] = 1  # type: ignore[index]


def test_fingerprint_covers_exactly_what_hot_and_cold_replicas_share():
    base = load_cluster_yaml(CLUSTER_YAML)
    fp = base.replica_fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", fp)
    assert AppConfig.from_args(base.to_dict()).replica_fingerprint() == fp

    def with_(section: str, **changes) -> str:
        args = base.to_dict()
        args[section] = {**args[section], **changes}
        return AppConfig.from_args(args).replica_fingerprint()

    assert with_("engine", max_num_seqs=33) != fp
    assert with_("model", served_name="other") != fp
    assert with_("replica", torch_threads=3) != fp
    assert with_("pools", hot={"num_replicas": 3}) == fp
    assert with_("tiers", offline={"max_waiting": 1}) != fp  # replicas admit by these
    assert with_("server", retry_after_s=5) != fp
    assert with_("controller", interval_s=30) == fp
