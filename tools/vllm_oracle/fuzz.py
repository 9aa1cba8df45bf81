#!/usr/bin/env python3
"""Differential fuzzing: random traces and engine settings through vLLM 0.25.1 or 0.33.0
(``oracle.py``) and apcsim, every request's ``hit_tokens``, ``num_preemptions`` and
``readmit_hit_tokens``, the summed ``PrefixCacheStats`` and the step count compared exactly (what
``tests/test_vllm_agreement.py`` checks on the committed fixtures).

``--vllm-version 0.33.0`` runs the oracle of ``venv033`` and apcsim with ``engine.vllm_version``
0.33.0; ``--offload-share F`` then gives a share of the cases a random CPU offload tier (vLLM's
OffloadingConnector with the oracle's stub worker; apcsim's tier through ``sim.core.step_driver``
with ``StepDelayWorker``, as ``tests/test_offload_agreement.py`` replays the offload fixtures): CPU
chunks from 1 to about the trace's distinct blocks, LRU/ARC, 1-4 blocks per chunk, store
thresholds, decode KV stored or not, transfers of 1-3 steps; those cases also compare the CPU hit
tokens (first and re-admissions), the steps waiting for KV, the connector's prefix-cache stats, the
prompt tokens by source and the tier's counters::

    PYTHONPATH=../.. python fuzz.py --vllm-version 0.33.0 --offload-share 0.7 --cases 500 --out out/fuzz033

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


def random_offload(seed: int, trace: list[dict], e: dict) -> dict[str, Any]:
    """Seeded random CPU-tier settings for a case (the keys of the offload fixtures' manifest)."""
    rng = random.Random(seed ^ 0x5EED)
    bs = e["block_size"]
    distinct = {tuple(r["tokens"][: (i + 1) * bs]) for r in trace for i in range(len(r["tokens"]) // bs)}
    bpc = rng.choice((1, 1, 1, 2, 4))
    top = max(2, len(distinct) // bpc)
    return dict(num_cpu_chunks=rng.choice((1, 2, max(1, top // 8), max(1, top // 3), top, 2 * top)),
                blocks_per_chunk=bpc, policy=rng.choice(("lru", "arc")),
                offload_prompt_only=rng.random() < 0.8, store_threshold=rng.choice((0, 0, 0, 2, 3)),
                transfer_delay_steps=rng.choice((1, 1, 1, 2, 3)))


def offload_argv(o: dict[str, Any], block_size: int) -> list[str]:
    argv = ["--cpu-chunks", o["num_cpu_chunks"], "--offload-policy", o["policy"],
            "--offload-block-size", o["blocks_per_chunk"] * block_size, "--store-threshold", o["store_threshold"],
            "--transfer-delay-steps", o["transfer_delay_steps"]]
    if not o["offload_prompt_only"]:
        argv.append("--offload-all-tokens")
    return [str(x) for x in argv]


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


def apcsim_side(trace: Path, e: dict, vllm_version: str = "0.25.1") -> dict[str, Any]:
    """apcsim's rows, stats and step count for the case (or its error)."""
    from sim.experiment.config import config_from_dict
    from sim.experiment.run import replay_experiment

    cfg = config_from_dict({
        "name": "fuzz", "latency": {"kind": "fixed", "step_time_s": e["step_time"]},
        "engine": {k: e[k] for k in ("block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_num_seqs",
                                     "max_model_len", "policy", "long_prefill_token_threshold",
                                     "enable_chunked_prefill", "watermark", "async_scheduling")}
        | {"hash_algo": "fast", "hash_seed": 0, "vllm_version": vllm_version},
        "workload": {"kind": "trace", "path": str(trace)}, "replay": {"fast_forward": True}})
    try:
        res, _ = replay_experiment(cfg, progress=False)
    except Exception as exc:  # a stall is an outcome to compare, not a crash of the fuzzer
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {**apcsim_outcome(res), "empty_steps": int((res.steps["batch_size"] == 0).sum())}


TIER_KEYS = ("allocation_failures", "load_jobs", "store_jobs", "loaded_chunks", "stored_chunks", "evicted_chunks",
             "lookups_deferred")


def apcsim_offload_side(trace: Path, e: dict, o: dict, check: bool = True) -> dict[str, Any]:
    """apcsim with a CPU tier: the core scheduler driven by sim.core.step_driver with
    StepDelayWorker, as tests/test_offload_agreement.py replays the offload fixtures (requests here
    carry salts, LoRA names, priorities and prompt logprobs too)."""
    from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
    from sim.core.hashing import make_block_hasher
    from sim.core.offload.step_worker import StepDelayWorker
    from sim.core.request import Request
    from sim.core.scheduler import Scheduler
    from sim.core.step_driver import drive
    from sim.core.version_profile import V0_33_0

    if V0_33_0.threshold_within_max_model_len and e["long_prefill_token_threshold"] > e["max_model_len"]:
        # the config rule sim.experiment.engine_description applies (this side builds the core directly)
        return {"error": "ConfigError: long_prefill_token_threshold > max_model_len (vLLM 0.33.0 refuses it)"}
    lines = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
    hasher = make_block_hasher("fast", e["block_size"])
    reqs = [(float(d["arrival"]), Request(
        str(d["id"]), d["tokens"], int(d["output_tokens"]), uid=i, arrival_time=float(d["arrival"]),
        cache_salt=d.get("salt"), lora_name=d.get("lora"), priority=int(d.get("priority", 0) or 0),
        prompt_logprobs=bool(d.get("prompt_logprobs", False)), output_token_ids=d.get("output_token_ids"),
        hasher=hasher)) for i, d in enumerate(lines)]
    reqs.sort(key=lambda x: x[0])
    try:
        sched = Scheduler(
            SchedulerConfig(
                max_num_batched_tokens=e["max_num_batched_tokens"], max_num_seqs=e["max_num_seqs"],
                max_model_len=e["max_model_len"], enable_chunked_prefill=e["enable_chunked_prefill"],
                long_prefill_token_threshold=e["long_prefill_token_threshold"], policy=e["policy"],
                watermark=e["watermark"], async_scheduling=e["async_scheduling"], profile=V0_33_0),
            CacheConfig(block_size=e["block_size"], num_gpu_blocks=e["num_gpu_blocks"], offload=OffloadConfig(
                o["num_cpu_chunks"], o["blocks_per_chunk"], o["policy"], o["offload_prompt_only"],
                o["store_threshold"])),
            hasher)
        res = drive(sched, reqs, e["step_time"], StepDelayWorker(o["transfer_delay_steps"]), check=check)
    except Exception as exc:  # a stall is an outcome to compare, not a crash of the fuzzer
        return {"error": f"{type(exc).__name__}: {exc}"}
    rows = {rid: (x.hit_tokens, x.num_preemptions, ";".join(str(g) for g, _ in x.readmit_hits),
                  x.external_hit_tokens, ";".join(str(c) for _, c in x.readmit_hits), x.steps_waiting_for_kv)
            for rid, x in res.requests.items()}
    tier = sched.tier
    ext = tier.external_prefix_cache_stats
    cs, ms = tier.connector.stats, tier.connector.manager.stats
    extra = {
        "connector_prefix_cache": {k: getattr(ext, k) for k in STAT_FIELDS},
        "prompt_tokens_by_source": {"local_cache_hit": tier.prompt_tokens_local_hit,
                                    "external_kv_transfer": tier.prompt_tokens_external,
                                    "local_compute": tier.prompt_tokens_computed},
        "cpu_tier": dict(zip(TIER_KEYS, (cs.allocation_failures, cs.load_jobs, cs.store_jobs, ms.chunks_loaded,
                                         ms.chunks_stored, ms.chunks_evicted, cs.deferred_lookups))),
    }
    return {"rows": rows, "stats": {k: getattr(res.prefix_cache, k) for k in STAT_FIELDS},
            "steps": None, "extra": extra}


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


def vllm_offload_side(out: Path, rec: dict) -> dict[str, Any]:
    if not rec["ok"]:
        return {"error": rec["error"]}
    with open(out / "vllm.csv", newline="") as f:
        rows = {r["id"]: (int(r["hit_tokens"]), int(r["num_preemptions"]), r["readmit_hit_tokens"],
                          int(r["external_hit_tokens"]), r["readmit_external_hit_tokens"],
                          int(r["steps_waiting_for_kv"])) for r in csv.DictReader(f)}
    st = json.loads((out / "vllm.stats.json").read_text())
    extra = {"connector_prefix_cache": {k: st["connector_prefix_cache"][k] for k in STAT_FIELDS},
             "prompt_tokens_by_source": st["prompt_tokens_by_source"],
             "cpu_tier": {k: st["cpu_tier"][k] for k in TIER_KEYS}}
    return {"rows": rows, "stats": {k: st[k] for k in STAT_FIELDS}, "steps": None, "extra": extra,
            "empty_steps": st.get("empty_steps", 0)}


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
    for k, x in v.get("extra", {}).items():
        if a.get("extra", {}).get(k) != x:
            out.append(f"{k}: vllm {x} apcsim {a.get('extra', {}).get(k)}")
    if v["steps"] is not None and a["steps"] - v["steps"] not in ((0, 1) if async_mode else (0,)):
        out.append(f"steps: vllm {v['steps']} apcsim {a['steps']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--async-share", type=float, default=0.75, help="share of cases run with async scheduling")
    ap.add_argument("--out", default=str(HERE / "out" / "fuzz"))
    ap.add_argument("--vllm-version", default="0.25.1", choices=["0.25.1", "0.33.0"])
    ap.add_argument("--offload-share", type=float, default=0.0,
                    help="0.33.0: share of cases with a random CPU offload tier")
    ap.add_argument("--python", default=None, help="the oracle venv's python (default venv/ or venv033/)")
    ap.add_argument("--oracle-arg", action="append", default=[], help="extra oracle.py argument (repeatable)")
    ap.add_argument("--time-limit-s", type=float, default=None, help="stop starting cases after this")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.offload_share and a.vllm_version == "0.25.1":
        ap.error("--offload-share needs --vllm-version 0.33.0")
    python = a.python or str(HERE / ("venv" if a.vllm_version == "0.25.1" else "venv033") / "bin" / "python")
    proc = start_oracle(python)
    t0 = time.time()
    counts = {"cases": 0, "async": 0, "sync": 0, "offload": 0, "disagreements": 0, "both_refused": 0,
              "with_empty_steps": 0, "empty_steps_vllm": 0}
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
        o = None
        if a.offload_share and random.Random(seed ^ 0xC0FFEE).random() < a.offload_share:
            o = random_offload(seed, trace, e)
            counts["offload"] += 1
        extra = a.oracle_arg + (offload_argv(o, e["block_size"]) if o is not None else [])
        submit(proc, str(i), oracle_argv(tpath, case_dir, e, extra))
        # meanwhile vLLM runs the same case
        a_res = apcsim_offload_side(tpath, e, o) if o is not None else apcsim_side(tpath, e, a.vllm_version)
        rep = read_report(proc)
        v_res = vllm_offload_side(case_dir, rep) if o is not None else vllm_side(case_dir, rep)
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
            (case_dir / "settings.json").write_text(
                json.dumps({"seed": seed, "engine": e, "offload": o, "diff": diff}, indent=1))
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
    summary = {**counts, "seed": a.seed, "async_share": a.async_share, "vllm_version": a.vllm_version,
               "offload_share": a.offload_share, "oracle_args": a.oracle_arg,
               "seconds": round(time.time() - t0, 1), "disagreeing_cases": bad}
    (out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "disagreeing_cases"}))
    return 1 if counts["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
