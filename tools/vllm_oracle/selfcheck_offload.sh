#!/usr/bin/env bash
# Offload self-check (vLLM 0.33.0 venv): replay the hand-made traces of selfcheck_offload/
# through the OffloadingConnector with the stub worker and assert the known results.
# Usage: ./selfcheck_offload.sh [extra oracle args]. Exit 0 iff all pass.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="$HERE/venv033/bin/python"
[[ -x "$PY" ]] || { echo "venv033 missing: run ./setup.sh --version 0.33.0 first" >&2; exit 2; }
"$PY" "$HERE/selfcheck_offload/make_traces.py"
OUTDIR="$(mktemp -d)"
trap 'rm -rf "$OUTDIR"' EXIT
VLLM_LOGGING_LEVEL=ERROR "$PY" - "$HERE" "$OUTDIR" "$@" <<'PY'
import csv, json, os, sys
here, outdir, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, here)
import oracle  # noqa: E402  (one process, vLLM imported once)
cases = json.load(open(os.path.join(here, "selfcheck_offload", "expected.json")))
passed = failed = 0
for name, c in cases.items():
    out = os.path.join(outdir, name + ".csv")
    st_path = os.path.join(outdir, name + ".json")
    argv = [os.path.join(here, "selfcheck_offload", name + ".jsonl"), "--out", out,
            "--stats-out", st_path, "--quiet", *c["args"], *extra]
    try:
        res, stats = oracle.replay(oracle.parse_args(argv, batch_ok=False))
        oracle.write_outputs(oracle.parse_args(argv, batch_ok=False), res, stats)
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: {type(e).__name__}: {e}")
        failed += 1
        continue
    rows = {r["id"]: r for r in csv.DictReader(open(out))}
    bad = []
    for rid, cols in c["expect"].items():
        for col, v in cols.items():
            if str(rows[rid][col]) != str(v):
                bad.append(f"{rid}.{col}={rows[rid][col]!r} (want {v!r})")
    for key, v in c["stats"].items():
        x = stats
        for part in key.split("."):
            x = x.get(part) if isinstance(x, dict) else None
        if x != v:
            bad.append(f"stats {key}={x!r} (want {v!r})")
    if bad:
        print(f"FAIL {name}: " + "; ".join(bad))
        failed += 1
    else:
        print(f"ok   {name}: " + ", ".join(
            f"{rid}:{r['hit_tokens']}+{r['external_hit_tokens']}" for rid, r in rows.items()))
        passed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
