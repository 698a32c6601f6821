"""The application config: cluster.yaml loads, defaults hold, every mistake is named precisely."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from serving.config import AppConfig, load_cluster_yaml
from serving.config.model import ModelSection
from serving.config.sections import (
    DEFAULT_TIERS,
    TIER_NAMES,
    ColdPool,
    ControllerSection,
    HotPool,
    LeadOverride,
    ReplicaSection,
    ServerSection,
    TierConfig,
)
from serving.engine.config import EngineConfig

CLUSTER_YAML = Path(__file__).resolve().parents[3] / "cluster.yaml"


def raises(args, *fragments: str) -> str:
    """from_args(args) must fail with a message holding every fragment; returns the message."""
    with pytest.raises(ValueError) as info:
        AppConfig.from_args(args)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# --- the shipped file ----------------------------------------------------------------------------


def test_shipped_cluster_yaml_loads_with_the_documented_values():
    cfg = load_cluster_yaml(CLUSTER_YAML)
    assert cfg.engine == EngineConfig(
        kv_mode="reserve",
        block_size_tokens=16,
        max_num_seqs=32,
        min_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=2048,
        kv_cache_bytes=268435456,
    )
    assert cfg.model == ModelSection(source="embedded")
    assert cfg.pools.hot == HotPool(num_replicas=1, resources={})
    assert cfg.pools.cold == ColdPool(min_replicas=0, max_replicas=2, initial_replicas=0)
    # The hot replica holds the 2-core example node; `auto` lays out its threads (decision 10).
    assert cfg.replica == ReplicaSection(num_cpus=2, torch_threads=2, stream_interval_s=0.3)
    assert cfg.server.api_key_env is None
    assert dict(cfg.tiers) == dict(DEFAULT_TIERS)
    # on by default: the forecast-driven cold pool under Serve's autoscaling policy
    assert cfg.controller == ControllerSection(enabled=True)
    assert cfg.controller.scaler == "serve_policy"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own pydantic-v1 style fields
def test_shipped_cluster_yaml_is_valid_for_ray_serve():
    from ray.serve.schema import ServeDeploySchema

    doc = yaml.safe_load(CLUSTER_YAML.read_text())
    schema = ServeDeploySchema.model_validate(doc)
    app, embed = schema.applications  # the LLM, and the embedding app
    assert (app.name, app.route_prefix, app.import_path) == (
        "tideserve",
        "/",
        "serving.app:build_app",
    )
    assert (embed.name, embed.route_prefix) == ("embeddings", "/embed")
    assert schema.http_options.host == "127.0.0.1"
    assert schema.http_options.port == 8000


def test_commented_examples_in_cluster_yaml_are_valid():
    # The commented tiers / lead_overrides lines are documentation users will uncomment: keep
    # them valid. "      #   interactive: ..." -> "  interactive: ...": drop the args block's
    # indent, then the "# " of a commented line; up to the first line indented less than args.
    lines = CLUSTER_YAML.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "# tiers:")
    ends = (i for i in range(start, len(lines)) if lines[i].strip() and lines[i][:6].strip())
    end = next(ends, None)
    block = "\n".join(re.sub(r"^(\s*)# ", r"\1", line[6:]) for line in lines[start:end])
    args = yaml.safe_load(block)
    cfg = AppConfig.from_args(args)
    assert cfg.controller.lead_overrides == (LeadOverride("07:30", "09:00", 1800.0),)


def test_missing_file_and_missing_app_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        load_cluster_yaml(tmp_path / "nope.yaml")
    found = r"found \['tideserve', 'embeddings'\]"
    with pytest.raises(ValueError, match=r"no application named 'other'; " + found):
        load_cluster_yaml(CLUSTER_YAML, app_name="other")
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n  - name: tideserve\n    args: {engine: {max_num_seqz: 3}}\n")
    with pytest.raises(
        ValueError, match=r"bad\.yaml: application 'tideserve': engine\.max_num_seqz"
    ):
        load_cluster_yaml(bad)
    bad.write_text("proxy_location: HeadOnly\n")
    with pytest.raises(ValueError, match="not a Ray Serve config file"):
        load_cluster_yaml(bad)


# --- defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [None, {}, {"engine": None, "tiers": {}}])
def test_no_args_means_all_defaults(args):
    cfg = AppConfig.from_args(args)
    assert cfg == AppConfig()
    assert cfg.engine == EngineConfig()
    assert tuple(cfg.tiers) == TIER_NAMES == ("interactive", "analytical", "offline")
    assert cfg.tiers["interactive"] == TierConfig(1.0, 20.0, 10.0, 64, 0.5)
    assert cfg.tiers["offline"].max_waiting == 1024
    assert (cfg.pools.hot.num_replicas, cfg.pools.cold.max_replicas) == (1, 2)
    assert cfg.replica.max_queued_requests == 128
    assert cfg.server.max_tokens_limit == 4096
    assert cfg.controller.forecast_lead_s == 900.0


def test_a_partial_tier_keeps_that_tiers_other_defaults():
    cfg = AppConfig.from_args({"tiers": {"offline": {"max_waiting": 10}}})
    assert cfg.tiers["offline"] == dataclasses.replace(DEFAULT_TIERS["offline"], max_waiting=10)
    assert cfg.tiers["interactive"] == DEFAULT_TIERS["interactive"]


def test_ints_are_accepted_where_floats_are_expected_and_stored_as_floats():
    cfg = AppConfig.from_args({"replica": {"num_cpus": 2}, "engine": {"kv_low_watermark": 0}})
    assert cfg.replica.num_cpus == 2.0 and type(cfg.replica.num_cpus) is float
    assert type(cfg.engine.kv_low_watermark) is float
    assert (
        cfg.replica_fingerprint()
        == AppConfig(
            replica=ReplicaSection(num_cpus=2.0), engine=EngineConfig(kv_low_watermark=0.0)
        ).replica_fingerprint()
    )


# --- unknown keys --------------------------------------------------------------------------------


def test_unknown_top_level_key_lists_the_sections_and_suggests_one():
    msg = raises({"engin": {"max_num_seqs": 8}}, "engin=", "did you mean 'engine'?")
    for section in ("model", "engine", "tiers", "pools", "replica", "server", "controller"):
        assert repr(section) in msg


@pytest.mark.parametrize(
    ("old", "new"),
    [("batch", "batch_api"), ("batching", "dynamic_batching")],
)
def test_a_renamed_section_is_an_error_naming_its_new_name(old, new):
    """`batch:` (the Batch API) and `batching:` (an embedding app's batcher) were one letter apart:
    each now has a name of its own, and the old one fails closed instead of being ignored."""
    for task in ("generate", "embed"):
        with pytest.raises(ValueError, match=rf"^{old}: is no longer a key; it was renamed {new} "):
            AppConfig.from_args({"model": {"task": task}, old: {}})


def test_the_batch_api_and_dynamic_batching_sections_read_under_their_names():
    cfg = AppConfig.from_args({"batch_api": {"max_in_flight": 3}})
    assert cfg.batch_api.max_in_flight == 3 and cfg.dynamic_batching is None
    raises({"batch_api": {"max_in_flight": 0}}, "batch_api.max_in_flight=0 is out of range")
    embed = AppConfig.from_args({"model": {"task": "embed"}, "dynamic_batching": {"max_queue": 9}})
    assert embed.dynamic_batching.max_queue == 9
    raises({"model": {"task": "embed"}, "batch_api": {}}, "batch_api=", "applies only to")


def test_misspelled_engine_key_names_its_path_value_and_the_closest_key():
    msg = raises({"engine": {"max_num_seqz": 32}}, "engine.max_num_seqz=32", "'kv_mode'")
    assert msg.endswith("did you mean 'max_num_seqs'?")


@pytest.mark.parametrize(
    "args, path, suggestion",
    [
        ({"model": {"sorce": "x"}}, "model.sorce", "source"),
        ({"tiers": {"interactive": {"ttft_p99": 1}}}, "tiers.interactive.ttft_p99", "ttft_p99_s"),
        ({"pools": {"cold": {"max_replica": 3}}}, "pools.cold.max_replica", "max_replicas"),
        ({"pools": {"cool": {}}}, "pools.cool", "cold"),
        ({"replica": {"num_gpu": 1}}, "replica.num_gpu", "num_gpus"),
        ({"server": {"api_key": "K"}}, "server.api_key", "api_key_env"),
        ({"controller": {"interval": 5}}, "controller.interval", "interval_s"),
        (
            {"controller": {"lead_overrides": [{"start": "01:00", "end": "02:00", "lead": 1}]}},
            "controller.lead_overrides[0].lead",
            "lead_s",
        ),
    ],
)
def test_nested_unknown_keys_name_the_full_path(args, path, suggestion):
    raises(args, f"{path}=", "is not a known key", f"did you mean {suggestion!r}?")


def test_unknown_tier_name_lists_the_tiers_and_guesses_only_when_close():
    msg = raises(
        {"tiers": {"batch": {}}}, "tiers.batch=", "['analytical', 'interactive', 'offline']"
    )
    assert "did you mean" not in msg


# --- types ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"engine": {"max_num_seqs": "32"}}, "engine.max_num_seqs='32' must be an integer"),
        ({"engine": {"max_num_seqs": True}}, "engine.max_num_seqs=True must be an integer"),
        ({"engine": {"max_num_seqs": 8.0}}, "engine.max_num_seqs=8.0 must be an integer"),
        ({"replica": {"num_cpus": True}}, "replica.num_cpus=True must be a number"),
        ({"tiers": {"offline": {"max_waiting": 1.5}}}, "tiers.offline.max_waiting=1.5"),
        ({"model": {"trust_remote_code": "yes"}}, "model.trust_remote_code='yes' must be true"),
        ({"model": {"source": 7}}, "model.source=7 must be a non-empty string"),
        ({"engine": [1, 2]}, "engine=[1, 2] must be a mapping"),
        ({"pools": {"hot": {"resources": ["pool_hot"]}}}, "pools.hot.resources=['pool_hot']"),
        (
            {"pools": {"hot": {"resources": {"pool_hot": True}}}},
            "pools.hot.resources.pool_hot=True",
        ),
        ({"controller": {"lead_overrides": {"start": "01:00"}}}, "controller.lead_overrides="),
        ({"server": {"api_key_env": "sk-live-123"}}, "server.api_key_env=<value not shown>"),
    ],
)
def test_wrong_types_are_refused_by_path(args, fragment):
    raises(args, fragment)


def test_an_api_key_pasted_in_place_of_its_variable_name_is_not_echoed():
    msg = raises({"server": {"api_key_env": "sk-live-123"}}, "NAME of an environment variable")
    assert "sk-live-123" not in msg
    assert AppConfig.from_args({"server": {"api_key_env": "TIDESERVE_API_KEY"}}).server.api_key_env


def test_an_unquoted_yaml_time_is_explained():
    args = yaml.safe_load("controller: {lead_overrides: [{start: 22:00, end: '02:00', lead_s: 5}]}")
    raises(args, "controller.lead_overrides[0].start=1320", 'quoted "HH:MM"')


# --- ranges --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({"engine": {"max_num_seqs": 0}}, "engine.max_num_seqs=0 is out of range; allowed: 1 <="),
        ({"engine": {"gpu_memory_utilization": 0}}, "allowed: 0.0 < gpu_memory_utilization"),
        ({"engine": {"kv_mode": "lazy"}}, "engine.kv_mode='lazy' is not allowed; choose one of"),
        ({"tiers": {"interactive": {"ttft_p99_s": 0}}}, "tiers.interactive.ttft_p99_s=0.0"),
        ({"tiers": {"analytical": {"max_waiting": -1}}}, "allowed: 0 <= max_waiting"),
        ({"pools": {"hot": {"num_replicas": 0}}}, "pools.hot.num_replicas=0 is out of range"),
        ({"pools": {"cold": {"min_replicas": -1}}}, "allowed: 0 <= min_replicas"),
        ({"pools": {"hot": {"resources": {"pool_hot": -1}}}}, "pools.hot.resources.pool_hot=-1"),
        ({"pools": {"hot": {"resources": {"GPU": 1}}}}, "set replica.num_gpus instead"),
        ({"replica": {"num_gpus": -0.5}}, "replica.num_gpus=-0.5 is out of range"),
        ({"replica": {"max_queued_requests": 0}}, "use -1 (no limit) or >= 1"),
        ({"replica": {"graceful_shutdown_timeout_s": 0}}, "allowed: 0.0 < graceful_shutdown"),
        ({"server": {"max_body_bytes": 0}}, "server.max_body_bytes=0 is out of range"),
        ({"controller": {"interval_s": float("inf")}}, "must be a finite number of seconds"),
        ({"controller": {"cold_start_margin_s": -1}}, "allowed: 0.0 <= cold_start_margin_s"),
        (
            {"controller": {"lead_overrides": [{"start": "24:00", "end": "01:00", "lead_s": 1}]}},
            "controller.lead_overrides[0].start='24:00'",
        ),
        (
            {"controller": {"lead_overrides": [{"start": "01:00", "end": "01:00", "lead_s": 1}]}},
            "controller.lead_overrides[0].end='01:00' must differ from start",
        ),
        (
            {"controller": {"lead_overrides": [{"start": "01:00", "lead_s": 1}]}},
            "controller.lead_overrides[0].end is required",
        ),
    ],
)
def test_out_of_range_values_say_what_is_allowed(args, fragment):
    raises(args, fragment)


# --- cross-field ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cold, first, second",
    [
        ({"min_replicas": 2}, "min_replicas=2", "initial_replicas=1"),
        ({"initial_replicas": 3}, "initial_replicas=3", "max_replicas=2"),
        ({"min_replicas": 3, "initial_replicas": 3}, "initial_replicas=3", "max_replicas=2"),
    ],
)
def test_cold_pool_bounds_name_both_fields(cold, first, second):
    raises({"pools": {"cold": cold}}, f"pools.cold.{first}", f"pools.cold.{second}")


def test_cross_field_errors_name_both_fields():
    raises(
        {"tiers": {"interactive": {"ttft_p99_s": 30}}},
        "tiers.interactive.ttft_p99_s=30.0 must be <= tiers.interactive.e2e_p99_s=20.0",
    )
    raises(
        {"server": {"default_max_tokens": 5000}},
        "server.default_max_tokens=5000 must be <= server.max_tokens_limit=4096",
    )
    raises({"engine": {"max_num_seqs": 4}}, "engine.min_num_seqs=16", "<= 4")


def test_overlapping_lead_overrides_are_refused_even_across_midnight():
    night = {"start": "22:00", "end": "02:00", "lead_s": 1800}
    early = {"start": "01:30", "end": "03:00", "lead_s": 600}
    raises(
        {"controller": {"lead_overrides": [night, early]}},
        "controller.lead_overrides[0] (22:00-02:00) overlaps controller.lead_overrides[1]",
    )
    late = {"start": "02:00", "end": "03:00", "lead_s": 600}  # [start, end): touching is fine
    cfg = AppConfig.from_args({"controller": {"lead_overrides": [night, late]}})
    lead = cfg.controller.lead_s_at
    assert (lead(23 * 60), lead(60), lead(2 * 60), lead(12 * 60)) == (1800.0, 1800.0, 600.0, 900.0)


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match=r"pools\.cold\.min_replicas=5 must be <="):
        ColdPool(min_replicas=5)
    with pytest.raises(ValueError, match=r"server\.retry_after_s=0"):
        ServerSection(retry_after_s=0)
    with pytest.raises(ValueError, match="tiers"):
        AppConfig(tiers={"interactive": DEFAULT_TIERS["interactive"]})


def test_embedded_source_matches_the_model_resolver():
    models = pytest.importorskip("serving.model_source")
    assert ModelSection().source == models.EMBEDDED


def test_replica_torch_threads_is_auto_by_default_or_a_positive_integer():
    assert ReplicaSection().torch_threads == "auto"
    assert AppConfig.from_args({"replica": {"torch_threads": 3}}).replica.torch_threads == 3
    with pytest.raises(ValueError, match=r"replica\.torch_threads='many': expected 'auto' or"):
        AppConfig.from_args({"replica": {"torch_threads": "many"}})
    with pytest.raises(ValueError, match=r"replica\.torch_threads=0 is out of range"):
        AppConfig.from_args({"replica": {"torch_threads": 0}})
