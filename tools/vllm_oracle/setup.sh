#!/usr/bin/env bash
# Recreate tools/vllm_oracle/venv from scratch: CPU torch + vLLM 0.25.1 (no deps)
# + only the pure-python / small deps that `vllm.v1.core.sched.scheduler` needs.
# Idempotent: if the venv already imports the scheduler with the right versions,
# it does nothing; pass --force to rebuild.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="$HERE/venv"
# vLLM: a local wheel file if VLLM_WHEEL names one, else vllm==0.25.1 from the package index.
WHEEL="${VLLM_WHEEL:-vllm==0.25.1}"
# torch: any CPU build works for the scheduler path; TORCH_SPEC / TORCH_INDEX_URL override, e.g.
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu ./setup.sh
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_PIP_ARGS=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && TORCH_PIP_ARGS=(--index-url "$TORCH_INDEX_URL")

check() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
assert md.version("vllm") == "0.25.1", md.version("vllm")
import torch  # noqa  (any CPU build; the fixtures were made with 2.13.0+cpu)
# no CUDA wheels must have sneaked in
bad = [d.metadata["Name"] for d in md.distributions()
       if d.metadata["Name"].lower().startswith(("nvidia-", "triton", "torchvision", "torchaudio"))]
assert not bad, bad
from vllm.v1.core.sched.scheduler import Scheduler  # noqa
import einops  # noqa  (needed by ModelConfig's model-class inspection)
PY
}

if [[ "${1:-}" != "--force" ]] && [[ -x "$VENV/bin/python" ]] && check; then
  echo "venv OK: $VENV"; exit 0
fi

rm -rf "$VENV"
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
# 1. CPU torch. vLLM 0.25.1 pins torch==2.11.0 in METADATA, but the scheduler
#    path does not care (the fixtures were produced with the 2.13.0+cpu wheel).
"$PIP" install -q ${TORCH_PIP_ARGS[@]+"${TORCH_PIP_ARGS[@]}"} "$TORCH_SPEC"
# 2. vLLM itself WITHOUT its dependencies (they pull CUDA torch, flashinfer, ...)
"$PIP" install -q --no-deps "$WHEEL"
# 3. Dependencies actually needed by the import chain of the v1 scheduler
#    (versions from vLLM's METADATA where it gives them). Each of these was
#    checked with `pip install --dry-run` not to pull torch/triton/nvidia-*.
"$PIP" install -q numpy 'pydantic>=2.12.0' msgspec cbor2 psutil regex cachetools \
  'requests>=2.26.0' tqdm pyyaml cloudpickle 'pyzmq>=25.0.0' packaging \
  'transformers>=5.5.3' 'aiohttp>=3.13.3' 'openai-harmony>=0.0.3' 'openai>=2.0.0' \
  pillow pybase64 uvloop py-cpuinfo 'prometheus_client>=0.18.0' \
  'llguidance<1.8.0,>=1.7.0' blake3 xxhash einops
# 4. xgrammar is imported at class-definition time by vllm.v1.structured_output
#    (a type annotation xgr.GrammarMatcher). Its deps include triton, so install
#    it --no-deps together with its only other missing runtime dep, tvm-ffi.
"$PIP" install -q --no-deps 'xgrammar<1.0.0,>=0.2.1' 'apache-tvm-ffi>=0.1.11'
check
# End-to-end smoke test: build a real Scheduler via the oracle and replay a
# 2-request trace (also exercises ModelConfig/VllmConfig construction).
printf '%s\n' '{"id":"a","arrival":0,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"output_tokens":2}' \
  '{"id":"b","arrival":1,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"output_tokens":2}' > "$VENV/smoke.jsonl"
"$VENV/bin/python" "$HERE/oracle.py" "$VENV/smoke.jsonl" --out "$VENV/smoke.csv" --num-gpu-blocks 16 --quiet >/dev/null 2>&1
grep -q '^b,32,' "$VENV/smoke.csv"
echo "venv built OK: $VENV"
