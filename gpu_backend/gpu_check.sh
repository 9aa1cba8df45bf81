#!/usr/bin/env bash
# The prepared GPU check: correctness suite on CUDA + speed benchmark (< 8 minutes on an
# H200), figures written to $OUT/gpu_check.{json,txt} (or --out DIR). From any directory:
#   bash gpu_backend/gpu_check.sh                       # CUDA
#   bash gpu_backend/gpu_check.sh --device cpu --quick  # CPU smoke test of the script itself
# Needs python3 with torch, numpy, pyyaml (triton optional); NOT simpy or pydantic, and no
# `pip install` of this repo: the repo root goes on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
exec "$PY" -m gpu_backend.gpu_check "$@"
