#!/usr/bin/env bash
# Self-check: replay the hand-made traces in selfcheck/ through the oracle
# and assert the known vLLM prefix-cache hit results. Exit 0 iff all pass.
# Usage: ./selfcheck.sh [extra oracle args, e.g. --async]
#        VENV=venv033 ./selfcheck.sh   (vLLM 0.33.0; same expected hits)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${VENV:-venv}"
PY="$HERE/$VENV/bin/python"
[[ -x "$PY" ]] || { echo "venv missing: run setup.sh first" >&2; exit 2; }
"$PY" "$HERE/selfcheck/make_traces.py"
OUTDIR="$(mktemp -d)"
trap 'rm -rf "$OUTDIR"' EXIT
"$PY" - "$HERE" "$OUTDIR" "$PY" "$@" <<'PY'
import csv, json, os, subprocess, sys
here, outdir, py, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cases = json.load(open(os.path.join(here, "selfcheck", "expected.json")))
passed = failed = 0
for name, c in cases.items():
    out = os.path.join(outdir, name + ".csv")
    cmd = [py,
           os.path.join(here, "oracle.py"),
           os.path.join(here, "selfcheck", name + ".jsonl"),
           "--out", out, "--num-gpu-blocks", "64", "--quiet", *c["args"], *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL {name}: oracle exited {p.returncode}\n{p.stderr[-2000:]}")
        failed += 1
        continue
    got = {r["id"]: int(r["hit_tokens"]) for r in csv.DictReader(open(out))}
    if got == c["hits"]:
        print(f"ok   {name}: {got}")
        passed += 1
    else:
        print(f"FAIL {name}: expected {c['hits']} got {got}")
        failed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
