"""`plan --plot` (capacity/plot.py) and `plan --write-cluster-yaml` (capacity/cluster_yaml.py)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capacity import memory
from capacity.cluster_yaml import write_pools
from capacity.planner import PlanInputs, plan
from serving.config import load_cluster_yaml
from tests.unit.test_planner import LLAMA3_8B

REPO = Path(__file__).resolve().parents[2]
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


# --- write_pools on the real cluster.yaml ---------------------------------------------------


def test_write_pools_changes_only_the_pool_numbers(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    before = path.read_text().splitlines(keepends=True)
    summary = write_pools(path, 4, 3)
    after = path.read_text().splitlines(keepends=True)
    changed = _changed(before, after)
    assert sorted(a.strip() for a, _ in changed.values()) == sorted(
        [
            "hot: {num_replicas: 1, resources: {}}   # always on; e.g. resources: {pool_hot: 1}",
            "max_replicas: 2",
        ]
    )
    assert sorted(b.strip() for _, b in changed.values()) == sorted(
        [
            "hot: {num_replicas: 4, resources: {}}   # always on; e.g. resources: {pool_hot: 1}",
            "max_replicas: 3",
        ]
    )
    # Every comment line is kept as it was.
    assert [x for x in before if x.lstrip().startswith("#")] == [
        x for x in after if x.lstrip().startswith("#")
    ]
    cfg = load_cluster_yaml(path)
    assert cfg.pools.hot.num_replicas == 4
    assert (cfg.pools.cold.min_replicas, cfg.pools.cold.max_replicas) == (0, 3)
    assert cfg.pools.cold.initial_replicas == 1
    assert "num_replicas: 1 -> 4" in summary and "max_replicas: 2 -> 3" in summary
    # Same numbers again: nothing to do, file untouched.
    text = path.read_bytes()
    assert "no change" in write_pools(path, 4, 3)
    assert path.read_bytes() == text


def test_write_pools_clamps_initial_replicas(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    before = path.read_text().splitlines(keepends=True)
    summary = write_pools(path, 2, 0)
    changed = _changed(before, path.read_text().splitlines(keepends=True))
    assert sorted(b.strip() for _, b in changed.values())[1:] == [
        "initial_replicas: 0",
        "max_replicas: 0",
    ]
    assert "clamped" in summary and "initial_replicas: 1 -> 0" in summary
    cfg = load_cluster_yaml(path)
    assert (cfg.pools.cold.initial_replicas, cfg.pools.cold.max_replicas) == (0, 0)


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
"""


def test_write_pools_block_hot_and_inline_cold(tmp_path):
    path = _copy_cluster_yaml(tmp_path, BLOCK_STYLE)
    summary = write_pools(path, 6, 2)
    before, after = BLOCK_STYLE.splitlines(), path.read_text().splitlines()
    assert _changed(before, after) == {
        7: (
            "          num_replicas: 1   # hot comment",
            "          num_replicas: 6   # hot comment",
        ),
        9: (
            "        cold: {min_replicas: 1, max_replicas: 5, initial_replicas: 4}  # cold comment",
            "        cold: {min_replicas: 1, max_replicas: 2, initial_replicas: 2}  # cold comment",
        ),
    }
    assert "clamped" in summary
    cold = load_cluster_yaml(path).pools.cold
    assert (cold.min_replicas, cold.initial_replicas, cold.max_replicas) == (1, 2, 2)
    with pytest.raises(ValueError, match=r"below pools\.cold\.min_replicas=1"):
        write_pools(path, 6, 0)


def test_write_pools_adds_a_missing_key(tmp_path):
    text = BLOCK_STYLE.replace("          num_replicas: 1   # hot comment\n", "")
    path = _copy_cluster_yaml(tmp_path, text)
    write_pools(path, 3, 5)
    after = path.read_text()
    assert after == text.replace(
        "          resources: {}\n", "          resources: {}\n          num_replicas: 3\n"
    )
    assert load_cluster_yaml(path).pools.hot.num_replicas == 3


def test_write_pools_rolls_back_when_validation_fails(tmp_path):
    # An unknown key elsewhere in args: the edit itself is fine, validating the whole file is not.
    text = CLUSTER_YAML.read_text().replace("        num_gpus: 0", "        num_gpuz: 0", 1)
    assert text != CLUSTER_YAML.read_text()
    path = _copy_cluster_yaml(tmp_path, text)
    original = path.read_bytes()
    with pytest.raises(ValueError, match="rolled back"):
        write_pools(path, 4, 3)
    assert path.read_bytes() == original


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("just: a mapping\n", "no `pools:` block"),
        (BLOCK_STYLE.replace("      pools:  # pools comment\n", "      poolz:\n"), "no `pools:`"),
        (BLOCK_STYLE.replace("num_replicas: 1 ", "num_replicas: one "), "not an integer"),
        (BLOCK_STYLE.replace("        cold: {", "        warm: {"), "unrecognised keys"),
        (BLOCK_STYLE + BLOCK_STYLE.split("applications:\n")[1], "more than one `pools:`"),
        (BLOCK_STYLE.replace("num_replicas: 1", "num_replicas: *n"), "anchors"),
    ],
)
def test_write_pools_refuses_unrecognised_files(tmp_path, text, match):
    path = _copy_cluster_yaml(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        write_pools(path, 4, 3)
    assert path.read_text() == text


def test_write_pools_refuses_bad_numbers(tmp_path):
    path = _copy_cluster_yaml(tmp_path)
    for hot, cold in ((0, 1), (1, -1), (1.5, 1), (True, 1)):
        with pytest.raises(ValueError, match="must be an integer"):
            write_pools(path, hot, cold)
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
    assert f"updated {yaml_path}: pools.hot.num_replicas" in proc.stderr
    _assert_png(png)
    cfg = load_cluster_yaml(yaml_path)
    assert cfg.pools.hot.num_replicas == result["hot_replicas"]
    assert cfg.pools.cold.max_replicas == result["cold_max_replicas"]
    expected = plan(_inputs())
    assert (result["hot_replicas"], result["cold_max_replicas"]) == (
        expected.hot_replicas,
        expected.cold_max_replicas,
    )
    # A broken yaml: the plan still prints, the command fails with the reason, file unchanged.
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: a mapping\n")
    proc = subprocess.run(
        [*cmd[:-1], str(bad)], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert proc.returncode == 2 and "Capacity plan" in proc.stdout
    assert "--write-cluster-yaml" in proc.stderr and "no `pools:` block" in proc.stderr
    assert bad.read_text() == "just: a mapping\n"
