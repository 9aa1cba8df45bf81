#!/usr/bin/env bash
# Recreate the oracle's venv for one vLLM version from scratch: CPU torch + vLLM (no deps)
# + only the pure-python / small deps that `vllm.v1.core.sched.scheduler` (and, for 0.33.0,
# the OffloadingConnector) import. Idempotent: if the venv already imports the scheduler with
# the right versions, it does nothing; pass --force to rebuild.
#
#   ./setup.sh                              # vLLM 0.25.1 -> venv/
#   ./setup.sh --version 0.33.0             # vLLM 0.33.0 -> venv033/
#   VLLM_VERSION=0.33.0 ./setup.sh --force  # same, rebuilt
#   VLLM_WHEEL=/path/vllm-0.33.0-...whl ./setup.sh --version 0.33.0   # a local wheel file
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${VLLM_VERSION:-0.25.1}"
FORCE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) FORCE=1 ;;
    --version) VERSION="$2"; shift ;;
    --version=*) VERSION="${1#--version=}" ;;
    *) echo "usage: $0 [--version 0.25.1|0.33.0] [--force]" >&2; exit 2 ;;
  esac
  shift
done
case "$VERSION" in
  0.25.1) VENV="$HERE/venv" ;;
  0.33.0) VENV="$HERE/venv033" ;;
  *) echo "unsupported vLLM version $VERSION (0.25.1 or 0.33.0)" >&2; exit 2 ;;
esac
# vLLM: a local wheel file if VLLM_WHEEL names one, else vllm==VERSION from the package index.
WHEEL="${VLLM_WHEEL:-vllm==$VERSION}"
# torch: any CPU build works for the scheduler path (0.25.1 pins 2.11.0, 0.33.0 pins 2.14.0;
# the fixtures were made with 2.13.0+cpu). TORCH_SPEC / TORCH_INDEX_URL override, e.g.
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu ./setup.sh
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_PIP_ARGS=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && TORCH_PIP_ARGS=(--index-url "$TORCH_INDEX_URL")

check() {
  VLLM_EXPECT="$VERSION" "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, os
assert md.version("vllm") == os.environ["VLLM_EXPECT"], md.version("vllm")
import torch  # noqa  (any CPU build; the fixtures were made with 2.13.0+cpu)
# no CUDA wheels must have sneaked in
bad = [d.metadata["Name"] for d in md.distributions()
       if d.metadata["Name"].lower().startswith(("nvidia-", "triton", "torchvision", "torchaudio",
                                                 "flashinfer"))]
assert not bad, bad
from vllm.v1.core.sched.scheduler import Scheduler  # noqa
import einops  # noqa  (needed by ModelConfig's model-class inspection)
if os.environ["VLLM_EXPECT"] != "0.25.1":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # noqa
        OffloadingConnector)
PY
}

if [[ "$FORCE" != 1 ]] && [[ -x "$VENV/bin/python" ]] && check; then
  echo "venv OK: $VENV (vLLM $VERSION)"; exit 0
fi

rm -rf "$VENV"
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
# 1. CPU torch (vLLM's METADATA pin is ignored: the scheduler path does not care).
"$PIP" install -q ${TORCH_PIP_ARGS[@]+"${TORCH_PIP_ARGS[@]}"} "$TORCH_SPEC"
# 2. vLLM itself WITHOUT its dependencies (they pull CUDA torch, flashinfer, ...).
#    Never `pip install vllm` without --no-deps afterwards either: pip would then resolve
#    and install the whole CUDA stack (~9 GB).
"$PIP" install -q --no-deps "$WHEEL"
# 3. Dependencies actually needed by the import chain of the v1 scheduler
#    (versions from vLLM's METADATA where it gives them). Each of these was
#    checked with `pip install --dry-run` not to pull torch/triton/nvidia-*.
if [[ "$VERSION" == 0.25.1 ]]; then
  "$PIP" install -q numpy 'pydantic>=2.12.0' msgspec cbor2 psutil regex cachetools \
    'requests>=2.26.0' tqdm pyyaml cloudpickle 'pyzmq>=25.0.0' packaging \
    'transformers>=5.5.3' 'aiohttp>=3.13.3' 'openai-harmony>=0.0.3' 'openai>=2.0.0' \
    pillow pybase64 uvloop py-cpuinfo 'prometheus_client>=0.18.0' \
    'llguidance<1.8.0,>=1.7.0' blake3 xxhash einops
  XGRAMMAR=('xgrammar<1.0.0,>=0.2.1' 'apache-tvm-ffi>=0.1.11')
else
  # 0.33.0: newer floors (transformers, requests, aiohttp, openai, pillow), the harmony fork
  # `oss-harmony` (module openai_harmony), and fastapi/starlette + partial-json-parser, which
  # the 0.33 import chain of vllm.config / the tool parsers reaches.
  "$PIP" install -q numpy 'pydantic>=2.12.0' msgspec cbor2 psutil regex cachetools \
    'requests>=2.33.0' tqdm pyyaml cloudpickle 'pyzmq>=25.0.0' packaging \
    'transformers>=5.16.1,<5.21.0' 'aiohttp>=3.14.4' 'oss-harmony>=0.0.11' 'openai>=2.25.0' \
    'pillow>=13.0.0' pybase64 uvloop py-cpuinfo 'prometheus_client>=0.18.0' \
    'llguidance<1.8.0,>=1.7.0' blake3 xxhash einops \
    'fastapi<0.137.0,>=0.133.0' 'starlette>=1.0.1' partial-json-parser
  XGRAMMAR=('xgrammar==0.2.8' 'apache-tvm-ffi==0.1.11')
fi
# 4. xgrammar is imported at class-definition time by vllm.v1.structured_output
#    (a type annotation xgr.GrammarMatcher). Its deps include triton, so install
#    it --no-deps together with its only other missing runtime dep, tvm-ffi.
"$PIP" install -q --no-deps "${XGRAMMAR[@]}"
check
# End-to-end smoke test: build a real Scheduler via the oracle and replay a
# 2-request trace (also exercises ModelConfig/VllmConfig construction).
printf '%s\n' '{"id":"a","arrival":0,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"output_tokens":2}' \
  '{"id":"b","arrival":1,"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"output_tokens":2}' > "$VENV/smoke.jsonl"
"$VENV/bin/python" "$HERE/oracle.py" "$VENV/smoke.jsonl" --out "$VENV/smoke.csv" --num-gpu-blocks 16 --quiet >/dev/null 2>&1
grep -q '^b,32,' "$VENV/smoke.csv"
echo "venv built OK: $VENV (vLLM $VERSION)"
