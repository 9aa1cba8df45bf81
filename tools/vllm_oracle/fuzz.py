#!/usr/bin/env python3
"""Differential fuzzing: random traces and engine settings through vLLM 0.25.1 (``oracle.py``) and
apcsim, every request's ``hit_tokens``, ``num_preemptions`` and ``readmit_hit_tokens``, the summed
``PrefixCacheStats`` and the step count compared exactly (what ``tests/test_vllm_agreement.py``
checks on the committed fixtures).

DEV-ONLY. Runs in apcsim's Python (simpy, pydantic, numpy); vLLM runs in the oracle venv
(``setup.sh``) as one warm ``oracle.py --batch -`` process fed job by job::

    PYTHONPATH=../.. python fuzz.py --cases 2000 --async-share 0.75 --out out/fuzz [--seed 0]
    PYTHONPATH=../.. python fuzz.py --cases 200 --oracle-arg=--no-free-empty   # a sensitivity check

Cases are seeded (``--seed``; case ``i`` uses ``seed * 1_000_003 + i``), so a disagreement is
reproduced by its case number; each one's trace, settings and both sides' rows are kept under
``--out`` (``case_<i>/``). The report (``--out``/``report.json``) counts cases, disagreements and
cases that both sides refused (e.g. a pool that deadlocks in vLLM and stalls apcsim), which agree.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_agreement_fixtures import chat_trace, min_pool, need_len  # noqa: E402

STAT_FIELDS = ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")


def random_case(seed: int, async_share: float) -> tuple[list[dict], dict]:
    """A seeded random trace (multi-turn chats with tenants and one-offs) and engine settings."""
    rng = random.Random(seed)
    bs = rng.choice((1, 2, 3, 4, 8, 16, 16, 16, 17, 32, 64, 128))
    n_sys = rng.randint(1, 3)
    sys_len = tuple(rng.randint(1, 12 * max(bs, 8)) for _ in range(n_sys))
    user_max = rng.randint(2, 8 * max(bs, 8))
    trace = chat_trace(
        seed, sessions=rng.randint(1, 24), turns=(1, rng.randint(1, 5)),
        system_len=sys_len, user_len=(1, user_max), out_len=(1, rng.randint(1, 48)),
        think=rng.choice((0.0, 0.005, 0.02, 0.1, 0.4)), start_gap=rng.choice((0.0005, 0.005, 0.03, 0.2)),
        max_context=max(sys_len) + user_max + rng.randint(0, 30 * max(bs, 16)),  # every first turn fits
        salts=rng.choice(((None,), (None, "", "s1"), (None, "t1", "t2"))),
        loras=rng.choice(((None,), (None, "L1"))), plp_frac=rng.choice((0.0, 0.0, 0.1)),
        priorities=rng.choice(((0,), (0, 1, 2), (0, -1, 3))), burst_frac=rng.random() * 0.6,
        extras=rng.randint(0, 6), block_size=bs)
    need = need_len(trace)
    e: dict[str, Any] = dict(
        block_size=bs, max_num_seqs=rng.choice((1, 2, 3, 4, 8, 16, 64, 256)),
        max_num_batched_tokens=rng.choice((8, 16, 32, 64, 128, 512, 2048, 8192)),
        max_model_len=need + rng.choice((0, 0, 1, 37, 500)),
        enable_chunked_prefill=rng.random() < 0.8,
        long_prefill_token_threshold=rng.choice((0, 0, 0, 1, 5, 33, 200)),
        watermark=rng.choice((0.0, 0.0, 0.01, 0.05, 0.2)), policy=rng.choice(("fcfs", "priority")),
        async_scheduling=rng.random() < async_share, step_time=rng.choice((0.01, 0.01, 0.001, 0.0033, 0.05)))
    e["max_num_batched_tokens"] = max(e["max_num_batched_tokens"], e["max_num_seqs"])
    if not e["enable_chunked_prefill"]:
        e["max_num_batched_tokens"] = max(e["max_num_batched_tokens"], e["max_model_len"])
    e["num_gpu_blocks"] = min_pool(trace, bs, e["max_model_len"]) + rng.choice((0, 1, 2, 3, 6, 12, 40, 5000))
    return trace, e


def oracle_argv(trace: Path, out: Path, e: dict, extra: list[str]) -> list[str]:
    argv = [str(trace), "--out", str(out / "vllm.csv"), "--stats-out", str(out / "vllm.stats.json"),
            "--block-size", e["block_size"], "--num-gpu-blocks", e["num_gpu_blocks"],
            "--max-model-len", e["max_model_len"], "--max-num-batched-tokens", e["max_num_batched_tokens"],
            "--max-num-seqs", e["max_num_seqs"], "--policy", e["policy"],
            "--long-prefill-token-threshold", e["long_prefill_token_threshold"], "--watermark", e["watermark"],
            "--step-time", e["step_time"], "--hash-algo", "sha256", "--hash-seed", "0", "--quiet",
            "--free-empty", *extra]
    if not e["enable_chunked_prefill"]:
        argv.append("--no-chunked-prefill")
    if e["async_scheduling"]:
        argv += ["--async", "--free-drain"]
    return [str(x) for x in argv]


def apcsim_side(trace: Path, e: dict) -> dict[str, Any]:
    """apcsim's rows, stats and step count for the case (or its error)."""
    from sim.experiment.config import config_from_dict
    from sim.experiment.run import replay_experiment

    cfg = config_from_dict({
        "name": "fuzz", "latency": {"kind": "fixed", "step_time_s": e["step_time"]},
        "engine": {k: e[k] for k in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
                                     "max_model_len", "policy", "long_prefill_token_threshold",
                                     "enable_chunked_prefill", "watermark", "async_scheduling")}
        | {"hash_algo": "fast", "hash_seed": 0},
        "workload": {"kind": "trace", "path": str(trace)}, "replay": {"fast_forward": True}})
    try:
        res, _ = replay_experiment(cfg, progress=False)
    except Exception as exc:  # a stall is an outcome to compare, not a crash of the fuzzer
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {**apcsim_outcome(res), "empty_steps": int((res.steps["batch_size"] == 0).sum())}


def apcsim_outcome(res: Any) -> dict[str, Any]:
    """A replay result's side of the comparison: per-request rows, summed stats, step count."""
    rows = {str(rid): (int(h), int(p), "" if rh is None else str(rh)) for rid, h, p, rh in
            res.requests[["request_id", "hit_tokens", "num_preemptions", "readmit_hit_tokens"]].itertuples(
                index=False, name=None)}
    return {"rows": rows, "stats": {k: getattr(res.prefix_cache, k) for k in STAT_FIELDS}, "steps": len(res.steps)}


def start_oracle(python: str) -> subprocess.Popen[str]:
    """One warm ``oracle.py --batch -`` process of the oracle venv's ``python``."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.Popen([python, str(HERE / "oracle.py"), "--batch", "-", "--quiet"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    return proc


def submit(proc: subprocess.Popen[str], name: str, argv: list[str]) -> None:
    """Hand the oracle one job (it starts at once; read its report with ``read_report``)."""
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"name": name, "argv": argv}) + "\n")
    proc.stdin.flush()


def read_report(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The oracle's report line of the job submitted last (vLLM's own log lines skipped)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line and not line.startswith("{"):
        line = proc.stdout.readline()
    if not line:
        raise SystemExit("the oracle process died")
    return json.loads(line)  # type: ignore[no-any-return]


def vllm_side(out: Path, rec: dict) -> dict[str, Any]:
    if not rec["ok"]:
        return {"error": rec["error"]}
    with open(out / "vllm.csv", newline="") as f:
        rows = {r["id"]: (int(r["hit_tokens"]), int(r["num_preemptions"]), r["readmit_hit_tokens"])
                for r in csv.DictReader(f)}
    st = json.loads((out / "vllm.stats.json").read_text())
    return {"rows": rows, "stats": {k: st[k] for k in STAT_FIELDS}, "steps": st["total_steps"],
            "empty_steps": st.get("empty_steps", 0)}


def differences(v: dict, a: dict, async_mode: bool) -> list[str]:
    if "error" in v or "error" in a:
        if "error" in v and "error" in a:
            return []  # both refuse (deadlock in vLLM, stall in apcsim)
        return [f"only one side failed: vllm={v.get('error')!r} apcsim={a.get('error')!r}"]
    out = [f"{rid}: vllm {v['rows'][rid]} apcsim {a['rows'].get(rid)}" for rid in v["rows"]
           if a["rows"].get(rid) != v["rows"][rid]]
    if v["stats"] != a["stats"]:
        out.append(f"stats: vllm {v['stats']} apcsim {a['stats']}")
    if a["steps"] - v["steps"] not in ((0, 1) if async_mode else (0,)):
        out.append(f"steps: vllm {v['steps']} apcsim {a['steps']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--async-share", type=float, default=0.75, help="share of cases run with async scheduling")
    ap.add_argument("--out", default=str(HERE / "out" / "fuzz"))
    ap.add_argument("--python", default=str(HERE / "venv" / "bin" / "python"), help="the oracle venv's python")
    ap.add_argument("--oracle-arg", action="append", default=[], help="extra oracle.py argument (repeatable)")
    ap.add_argument("--time-limit-s", type=float, default=None, help="stop starting cases after this")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    proc = start_oracle(a.python)
    t0 = time.time()
    counts = {"cases": 0, "async": 0, "sync": 0, "disagreements": 0, "both_refused": 0, "with_empty_steps": 0,
              "empty_steps_vllm": 0}
    bad: dict[int, list[str]] = {}
    for i in range(a.cases):
        if a.time_limit_s is not None and time.time() - t0 > a.time_limit_s:
            break
        seed = a.seed * 1_000_003 + i
        trace, e = random_case(seed, a.async_share)
        case_dir = out / f"case_{i}"
        case_dir.mkdir(exist_ok=True)
        tpath = case_dir / "trace.jsonl"
        tpath.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in trace))
        submit(proc, str(i), oracle_argv(tpath, case_dir, e, a.oracle_arg))
        a_res = apcsim_side(tpath, e)  # meanwhile vLLM runs the same case
        v_res = vllm_side(case_dir, read_report(proc))
        diff = differences(v_res, a_res, e["async_scheduling"])
        counts["cases"] += 1
        counts["async" if e["async_scheduling"] else "sync"] += 1
        counts["both_refused"] += "error" in v_res and "error" in a_res
        if "error" not in v_res:
            counts["with_empty_steps"] += v_res["empty_steps"] > 0
            counts["empty_steps_vllm"] += v_res["empty_steps"]
        if diff:
            counts["disagreements"] += 1
            bad[i] = diff[:20]
            (case_dir / "settings.json").write_text(json.dumps({"seed": seed, "engine": e, "diff": diff}, indent=1))
            print(f"case {i} ({'async' if e['async_scheduling'] else 'sync'}): {len(diff)} differences, "
                  f"first: {diff[0]}", flush=True)
        else:
            shutil.rmtree(case_dir)
        if counts["cases"] % 100 == 0:
            print(f"{counts['cases']} cases, {counts['disagreements']} disagreements, "
                  f"{time.time() - t0:.0f} s", flush=True)
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)
    summary = {**counts, "seed": a.seed, "async_share": a.async_share, "oracle_args": a.oracle_arg,
               "seconds": round(time.time() - t0, 1), "disagreeing_cases": bad}
    (out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "disagreeing_cases"}))
    return 1 if counts["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
