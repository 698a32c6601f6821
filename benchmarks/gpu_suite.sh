#!/usr/bin/env bash
# The prepared GPU check, one command, under 8 minutes on one GPU (see benchmarks/gpu_suite.py):
#   bash benchmarks/gpu_suite.sh [OUT.json]
# tests/gpu, then engine vs transformers continuous batching (generate_batch) vs static batching
# in bfloat16 on random-weight SmolLM2-135M / Llama-3.2-1B / Llama-3-8B shapes, then
# `capacity calibrate`. Needs torch + transformers only: no Ray, no weights, no network.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
exec timeout 470 "$PY" benchmarks/gpu_suite.py --quick --json "${1:-gpu_suite.json}"
