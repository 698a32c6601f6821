"""The vLLM peer of benchmarks/peer_http.py: found through $VLLM_VENV or said to be absent, and
the log lines that record its core layout kept; the tideserve variants (layouts, Ray options)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import _peers as pe
from benchmarks import peer_http


def test_vllm_venv_is_found_through_the_env_var_or_reported_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_VENV", str(tmp_path / "missing"))
    assert pe.vllm_python() is None
    (tmp_path / "v" / "bin").mkdir(parents=True)
    (tmp_path / "v" / "bin" / "python").touch()
    monkeypatch.setenv("VLLM_VENV", str(tmp_path / "v"))
    assert pe.vllm_python() == tmp_path / "v" / "bin" / "python"
    assert pe.vllm_python(str(tmp_path / "other")) is None  # an explicit dir wins


def test_vllm_command_serves_the_given_weights_at_the_given_dtype():
    cmd = pe.vllm_command(Path("/py"), Path("/m"), "float32", 18802, "peer-model")
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--model") + 1] == "/m"


def test_layout_lines_keep_the_binding_and_compile_lines_only():
    lines = [
        "INFO reserve_cpu_num=1",
        "INFO local_rank=0, core ids=[0]",
        "INFO GET /v1/models 200",
        "INFO Compiling model again due to a load failure",
    ]
    log = "\n".join(lines)
    assert pe.vllm_layout_lines(log) == [
        "INFO reserve_cpu_num=1",
        "INFO local_rank=0, core ids=[0]",
        "INFO Compiling model again due to a load failure",
    ]


def test_a_layout_variant_changes_only_the_llm_apps_torch_threads(tmp_path):
    src = Path(peer_http.c.REPO_ROOT) / "cluster.yaml"
    peer_http.serve_config(src, tmp_path / "a.yaml", torch_threads="2")
    apps = yaml.safe_load((tmp_path / "a.yaml").read_text())["applications"]
    shipped = yaml.safe_load(src.read_text())["applications"]
    assert apps[0]["args"]["replica"]["torch_threads"] == 2
    assert apps[1]["args"]["replica"] == shipped[1]["args"]["replica"]  # the embeddings app


def test_replica_ready_times_are_read_from_the_serve_log():
    log = "x hot replica ready in 7.3 s (model m)\ny cold replica ready in 4.9 s (model m)"
    assert peer_http.replica_ready_s(log) == [7.3, 4.9]


def test_ray_options_are_named_environments_and_an_unknown_one_is_refused(monkeypatch, capsys):
    assert peer_http.RAY_OPTIONS["throughput_optimized"] == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    assert all(k.startswith("RAY_SERVE_") for env in peer_http.RAY_OPTIONS.values() for k in env)
    monkeypatch.setattr("sys.argv", ["peer_http.py", "--ray-options", "direct_ingress,turbo"])
    with pytest.raises(SystemExit):
        peer_http.parse_args()
    assert "'turbo' is not one of none, throughput_optimized, haproxy" in capsys.readouterr().err
