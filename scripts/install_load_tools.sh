#!/usr/bin/env bash
# Load-test clients (guidellm, locust) in their own venv, .venv-load, beside the main .venv:
# their pins (transformers, gevent, ...) must not move the serving stack's. benchmarks/load_test.py
# calls them as subprocesses from this venv. Nothing here is needed to serve or to run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
if [ ! -x .venv-load/bin/python ]; then
  "$PY" -m venv .venv-load
fi
.venv-load/bin/pip install --quiet --upgrade pip
.venv-load/bin/pip install --quiet "guidellm==0.8.1" "locust==2.47.0"
.venv-load/bin/guidellm --help >/dev/null
.venv-load/bin/locust --version
