#!/usr/bin/env bash
# The prepared GPU run: calibrate the latency model (Llama-3-8B shapes, bf16) on the device
# and validate simulated against real per-request TTFT/TPOT/E2E on held-out chat and RAG workloads,
# < 8 minutes on an H200; model file and reports written to $OUT (or --out DIR). From any directory:
#   bash gpu_backend/gpu_calibrate.sh                        # CUDA
#   bash gpu_backend/gpu_calibrate.sh --device cpu --quick   # CPU smoke test of the script itself
# Needs python3 with torch, numpy, scipy, pandas, matplotlib, pyyaml (all on the H200 image) plus simpy and
# pydantic, which the image lacks: when they do not import, wheels carried in .whl/ are installed
# into /tmp/site (see gpu_backend/README.md for how to fetch them). No `pip install` of this repo.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if ! "$PY" -c "import simpy, pydantic" 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    echo "gpu_calibrate.sh: simpy/pydantic missing and no wheels in .whl/ (see gpu_backend/README.md)" >&2
    exit 2
  fi
fi
exec "$PY" -m gpu_backend.gpu_calibrate "$@"
