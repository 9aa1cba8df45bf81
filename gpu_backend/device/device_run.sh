#!/usr/bin/env bash
# One device script that cannot waste the run. From any directory:
#   bash gpu_backend/device/device_run.sh                        # CUDA (H200): the whole sequence, < 8 minutes
#   bash gpu_backend/device/device_run.sh --device cpu --quick   # the same script end to end on a CPU (CI)
# Options: --out DIR (default $OUT, else ./device_run_out), --results DIR (default
# results/reference/h200_llama3_8b on CUDA, <out>/../device_run_results on a CPU), --budget-s S (450).
#
# 1. preflight (seconds): imports, CUDA, free GPU memory and disk, one message per missing piece;
#    a missing package whose wheel is carried in .whl/ is installed into /tmp/site first (only the
#    missing ones); the plan says which stage runs, degrades or is skipped;
# 2. correctness (reuse = recompute, block-table check after every step)  3. long context (32k)
# 4. speed against the roofline  5. the CPU offload tier's GPU<->CPU link (copies timed both ways and fitted;
# on a CPU host<->host, labelled so)  6. calibration  7. validation on the chat and RAG configs.
# Every stage runs in its own process under its own timeout and writes its results the moment it
# ends, under --results and under --out (one file per stage, <= 8 files in all: the device tool's
# limit), so a timeout keeps everything finished before it. Exit status: 0 when every stage that ran
# held its checks, 1 otherwise, 2 when the preflight failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
DEVICE=cuda QUICK="" OUT_DIR="${OUT:-$ROOT/device_run_out}" RESULTS="" BUDGET=450
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --budget-s) BUDGET="$2"; shift 2 ;;
    *) echo "device_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$RESULTS" ]; then
  if [ "$DEVICE" = cuda ]; then RESULTS="$ROOT/results/reference/h200_llama3_8b"; else RESULTS="$OUT_DIR/../device_run_results"; fi
fi
mkdir -p "$OUT_DIR" "$RESULTS"
LOG="$OUT_DIR/log.txt"
: > "$LOG"
START=$(date +%s)
DEADLINE=$((START + ${BUDGET%.*}))
say() { echo "$*" | tee -a "$LOG"; }
say "device_run.sh: device $DEVICE ${QUICK:-(full)}; results -> $RESULTS; returned files -> $OUT_DIR; budget ${BUDGET} s"

# -- 1. preflight: install only the missing packages whose wheels were carried --------------------
missing=$("$PY" - <<'EOF'
import importlib
names = {"simpy": "simpy", "pydantic": "pydantic", "scipy": "scipy", "pandas": "pandas", "pyarrow": "pyarrow",
         "matplotlib": "matplotlib", "yaml": "pyyaml", "numpy": "numpy"}
for mod, dist in names.items():
    try:
        importlib.import_module(mod)
    except Exception:
        print(dist.replace("-", "_"))
EOF
)
if [ -n "$missing" ] && compgen -G ".whl/*.whl" >/dev/null; then
  wheels=()
  for dist in $missing; do
    for w in .whl/*.whl; do
      b=$(basename "$w" | tr '[:upper:]-' '[:lower:]_')
      case "$b" in "${dist}"-*) wheels+=("$w") ;; esac
    done
    # a missing pydantic needs its own dependencies too
    if [ "$dist" = pydantic ]; then
      for w in .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl; do
        [ -e "$w" ] && wheels+=("$w")
      done
    fi
  done
  if [ ${#wheels[@]} -gt 0 ]; then
    say "preflight: installing carried wheels for: $(echo $missing) -> /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
      >>"$LOG" 2>&1 && export PYTHONPATH="/tmp/site:$PYTHONPATH"
  fi
fi
timeout 60 "$PY" -m gpu_backend.device.preflight --device "$DEVICE" --out "$OUT_DIR" --results "$RESULTS" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  say "device_run.sh: preflight failed (exit $rc): nothing else runs"
  exit 2
fi

# -- 2..7. the stages, each in its own process with its own timeout ------------------------------
# seconds per stage on an H200 (the budget's shares); the last stage gets what is left
declare -A SHARE=([correctness]=80 [long_context]=50 [bench]=60 [link]=20 [calibration]=150 [validation]=0)
failed=0
for stage in correctness long_context bench link calibration validation; do
  now=$(date +%s)
  left=$((DEADLINE - now))
  if [ "$left" -le 5 ]; then
    say "== $stage: skipped, the budget is spent"
    failed=1
    continue
  fi
  share=${SHARE[$stage]}
  if [ "$share" -eq 0 ] || [ "$share" -gt "$left" ]; then share=$left; fi
  [ "$DEVICE" = cpu ] && share=$left  # CI: the budget caps the whole run, not each stage
  timeout --kill-after=10 "$share" "$PY" -m gpu_backend.device.device_stages "$stage" --device "$DEVICE" $QUICK \
    --results "$RESULTS" --out "$OUT_DIR" --deadline $((now + share - 5)) 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  case "$rc" in
    0) ;;
    3) say "== $stage: skipped (see the preflight's plan)" ;;
    124|137) say "== $stage: TIMED OUT after ${share} s (what it finished before is kept)"; failed=1 ;;
    *) say "== $stage: exit $rc"; failed=1 ;;
  esac
done
say "device_run.sh: done in $(( $(date +%s) - START )) s; $( [ $failed -eq 0 ] && echo 'every stage that ran held its checks' || echo 'SOME STAGE FAILED, TIMED OUT OR WAS CUT' )"
exit $failed
