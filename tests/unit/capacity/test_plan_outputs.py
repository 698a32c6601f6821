"""`plan --plot` (capacity/plot.py) and `plan --write-cluster-yaml` (capacity/cluster_yaml.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity import memory
from capacity.cluster_yaml import write_plan
from capacity.plan_settings import PlanSettings, plan_settings
from capacity.planner import PlanInputs, plan
from serving.config import load_cluster_yaml
from tests.unit.capacity.test_planner import LLAMA3_8B

REPO = Path(__file__).resolve().parents[3]
CLUSTER_YAML = REPO / "cluster.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (pip install matplotlib) - needed for --plot",
)

LLAMA_8B = LLAMA3_8B  # the same config.json fixture the planner tests use


def _inputs(**kw) -> PlanInputs:
    args = dict(
        model_config=LLAMA_8B,
        gpu="H100-SXM",
        avg_input_tokens=1000,
        avg_output_tokens=200,
        max_model_len=8192,
        peak_qps=50,
    )
    args.update(kw)
    return PlanInputs(**args)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # two panels with text, not an empty canvas


def _copy_cluster_yaml(tmp_path: Path, text: str | None = None) -> Path:
    dst = tmp_path / "cluster.yaml"
    dst.write_bytes(CLUSTER_YAML.read_bytes() if text is None else text.encode())
    return dst


def _changed(before: list[str], after: list[str]) -> dict[int, tuple[str, str]]:
    assert len(before) == len(after), "line count changed"
    return {n: (a, b) for n, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}


# --- plot ------------------------------------------------------------------------------------


@needs_matplotlib
def test_plot_plan_writes_a_png(tmp_path):
    from capacity.plot import plot_plan

    inputs = _inputs()
    out = tmp_path / "plan.png"
    assert plot_plan(inputs, plan(inputs), out) == str(out)
    _assert_png(out)


def test_concurrency_curve_uses_the_memory_formula():
    from capacity.plot import concurrency_curve

    p = plan(_inputs())
    lengths, conc = concurrency_curve(p.split.num_blocks, 16, 8192)
    assert lengths[0] == 128 and lengths[-1] == 8192 and lengths == sorted(set(lengths))
    assert conc[-1] == p.max_concurrency_max_len
    assert all(a >= b for a, b in itertools.pairwise(conc))  # longer sequences, fewer fit
    for n, c in zip(lengths, conc, strict=True):
        assert c == memory.max_concurrency(p.split.num_blocks, n, 16)
    # max_model_len below 128: the curve is the single point
    assert concurrency_curve(1000, 16, 64) == ([64], [memory.max_concurrency(1000, 64, 16)])


# --- write_plan on the real cluster.yaml -----------------------------------------------------

SETTINGS = PlanSettings(
    max_num_seqs=300,
    min_num_seqs=20,
    max_num_batched_tokens=1024,
    max_model_len=2048,
    block_size_tokens=16,
    gpu_memory_utilization=0.9,
    kv_cache_bytes=None,
    hot_replicas=4,
    cold_max_replicas=3,
    replica_capacity_rps=12.5,
    planned_kv_bytes=40 * 2**30,
)


def _with(**kw) -> PlanSettings:
    return dataclasses.replace(SETTINGS, **kw)


def test_write_plan_changes_only_the_lines_of_the_keys_it_owns(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    before = path.read_text().splitlines(keepends=True)
    summary = write_plan(path, SETTINGS)
    after = path.read_text().splitlines(keepends=True)
    changed = _changed(before, after)
    assert sorted(b.strip() for _, b in changed.values()) == sorted(
        [
            "max_num_seqs: 300              # concurrency while KV use is low, sliding down to",
            "min_num_seqs: 20               # this floor as the KV cache fills",
            "max_num_batched_tokens: 1024   # tokens per step; long prompts prefill in chunks",
            "kv_cache_bytes: null           # null: sized from device memory after weights +"
            " warm-up (GPU)",
            "hot: {num_replicas: 4, resources: {}}   # always on; e.g. resources: {pool_hot: 1}",
            "max_replicas: 3",
            # cluster.yaml has a controller section (the forecast cold pool, on by default)
            "replica_capacity_rps: 12.5    # req/s one replica sustains in the SLO (capacity plan)",
        ]
    )
    # Every comment line is kept, and so is every line of the embeddings app.
    assert [x for x in before if x.lstrip().startswith("#")] == [
        x for x in after if x.lstrip().startswith("#")
    ]
    assert (
        before[before.index("  - name: embeddings\n") :]
        == after[after.index("  - name: embeddings\n") :]
    )
    cfg = load_cluster_yaml(path)
    assert (cfg.engine.max_num_seqs, cfg.engine.min_num_seqs) == (300, 20)
    assert cfg.engine.max_num_batched_tokens == 1024 and cfg.engine.kv_cache_bytes is None
    assert cfg.pools.hot.num_replicas == 4
    assert (cfg.pools.cold.min_replicas, cfg.pools.cold.max_replicas) == (0, 3)
    assert "engine.max_num_seqs: 32 -> 300" in summary
    assert "pools.hot.num_replicas: 1 -> 4" in summary
    assert "controller.replica_capacity_rps: 2.0 -> 12.5" in summary
    # Same plan again: nothing to do, file untouched.
    text = path.read_bytes()
    assert "no change" in write_plan(path, SETTINGS)
    assert path.read_bytes() == text


def test_write_plan_result_is_what_build_app_accepts(tmp_path):
    from serving.app import build_graph
    from serving.config import AppConfig

    path = _copy_cluster_yaml(tmp_path)
    write_plan(path, SETTINGS)
    cfg = load_cluster_yaml(path)
    graph = build_graph(AppConfig.from_args(cfg.to_dict()))
    assert graph is not None


def test_write_plan_can_pin_kv_bytes_and_clamps_initial_replicas(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    text = path.read_text().replace("initial_replicas: 0 ", "initial_replicas: 1 ")
    path.write_text(text)  # the shipped file starts no cold replica; this one asks for one
    summary = write_plan(path, _with(kv_cache_bytes=3 * 2**30, cold_max_replicas=0))
    text = path.read_text()
    assert "kv_cache_bytes: 3221225472     # 3.00 GiB of KV cache per replica (capacity plan)" in (
        text
    )
    cfg = load_cluster_yaml(path)
    assert cfg.engine.kv_cache_bytes == 3 * 2**30
    assert (cfg.pools.cold.initial_replicas, cfg.pools.cold.max_replicas) == (0, 0)
    assert "pools.cold.initial_replicas: 1 -> 0" in summary


BLOCK_STYLE = """\
# top comment
applications:
  - name: tideserve
    import_path: serving.app:build_app
    args:
      pools:  # pools comment
        hot:
          num_replicas: 1   # hot comment
          resources: {}
        cold: {min_replicas: 1, max_replicas: 5, initial_replicas: 4}  # cold comment
      replica:
        num_cpus: 1

      controller:
        replica_capacity_rps: 2.0   # capacity comment
"""


def test_write_plan_adds_missing_keys_and_the_engine_section(tmp_path):
    path = _copy_cluster_yaml(tmp_path, BLOCK_STYLE)
    write_plan(path, _with(hot_replicas=6, cold_max_replicas=2))
    after = path.read_text()
    assert "          num_replicas: 6   # hot comment\n" in after
    assert (
        "        cold: {min_replicas: 1, max_replicas: 2, initial_replicas: 2}  # cold comment\n"
        in after
    )
    # the comment keeps its column; the added section goes last, in block style
    assert "      controller:\n        replica_capacity_rps: 12.5  # capacity comment\n" in after
    assert after.startswith("# top comment\n")
    assert "        num_cpus: 1\n\n      controller:\n" in after
    assert after.endswith("      engine:\n        max_num_seqs: 300\n" + after.split("300\n")[1])
    cfg = load_cluster_yaml(path)
    assert cfg.engine.max_num_seqs == 300 and cfg.controller.replica_capacity_rps == 12.5
    assert (cfg.pools.cold.min_replicas, cfg.pools.cold.initial_replicas) == (1, 2)
    with pytest.raises(ValueError, match=r"below pools\.cold\.min_replicas=1"):
        write_plan(path, _with(cold_max_replicas=0))


def test_write_plan_leaves_the_file_alone_when_validation_fails(tmp_path):
    # An unknown key elsewhere in args: the edit itself is fine, validating the whole file is not.
    text = CLUSTER_YAML.read_text().replace("        num_gpus: 0", "        num_gpuz: 0", 1)
    assert text != CLUSTER_YAML.read_text()
    path = _copy_cluster_yaml(tmp_path, text)
    original = path.read_bytes()
    with pytest.raises(ValueError, match="file unchanged"):
        write_plan(path, SETTINGS)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.yaml"]  # no temporary left


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("just: a mapping\n", "no 'applications' list"),
        ("applications: [{name: a, args: {pools: 3}}]\n", "pools must be a mapping"),
        (BLOCK_STYLE.replace("      pools:  # pools comment\n", "      pools: &p\n"), "anchor"),
        (BLOCK_STYLE + BLOCK_STYLE.split("applications:\n")[1], "2 LLM applications"),
        ("applications: [{name: a, args: {model: {task: embed}}}]\n", "0 LLM applications"),
        ("applications: [\n", "not valid YAML"),
    ],
)
def test_write_plan_refuses_unrecognised_files(tmp_path, text, match):
    path = _copy_cluster_yaml(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        write_plan(path, SETTINGS)
    assert path.read_text() == text


def test_write_plan_picks_the_named_application(tmp_path):
    doubled = BLOCK_STYLE + BLOCK_STYLE.split("applications:\n")[1].replace(
        "name: tideserve", "name: second"
    )
    path = _copy_cluster_yaml(tmp_path, doubled)
    write_plan(path, SETTINGS, app_name="second")
    assert load_cluster_yaml(path, "second").pools.hot.num_replicas == 4
    assert load_cluster_yaml(path, "tideserve").pools.hot.num_replicas == 1
    with pytest.raises(ValueError, match="no application named 'third'"):
        write_plan(path, SETTINGS, app_name="third")


def test_write_plan_refuses_zero_hot_replicas(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    with pytest.raises(ValueError, match="hot_replicas=0"):
        write_plan(path, _with(hot_replicas=0))
    assert path.read_bytes() == CLUSTER_YAML.read_bytes()


# --- CLI end to end --------------------------------------------------------------------------


@needs_matplotlib
def test_cli_plan_writes_plot_and_cluster_yaml(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    yaml_path = _copy_cluster_yaml(tmp_path)
    png = tmp_path / "plan.png"
    cmd = [sys.executable, "-m", "capacity", "plan", "--model", str(model), "--gpu", "H100-SXM"]
    cmd += ["--avg-input", "1000", "--avg-output", "200", "--max-model-len", "8192"]
    cmd += ["--peak-qps", "50", "--plot", str(png), "--write-cluster-yaml", str(yaml_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [*cmd, "--json"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # messages go to stderr with --json
    assert "plot: wrote" in proc.stderr
    assert f"updated {yaml_path}: controller.replica_capacity_rps" in proc.stderr
    assert "engine.kv_cache_bytes" in proc.stderr
    _assert_png(png)
    cfg = load_cluster_yaml(yaml_path)
    assert cfg.pools.hot.num_replicas == result["hot_replicas"]
    assert cfg.pools.cold.max_replicas == result["cold_max_replicas"]
    expected = plan(_inputs())
    assert (result["hot_replicas"], result["cold_max_replicas"]) == (
        expected.hot_replicas,
        expected.cold_max_replicas,
    )
    settings = plan_settings(expected)
    assert cfg.engine.max_num_seqs == settings.max_num_seqs == expected.max_concurrency_avg
    assert cfg.engine.min_num_seqs == expected.max_concurrency_max_len
    assert cfg.engine.max_num_batched_tokens == settings.max_num_batched_tokens
    assert cfg.engine.kv_cache_bytes is None and cfg.engine.gpu_memory_utilization == 0.9
    # A broken yaml: the plan still prints, the command fails with the reason, file unchanged.
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: a mapping\n")
    proc = subprocess.run(
        [*cmd[:-1], str(bad)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert proc.returncode == 2 and "Capacity plan" in proc.stdout
    assert "--write-cluster-yaml" in proc.stderr and "no 'applications' list" in proc.stderr
    assert bad.read_text() == "just: a mapping\n"
