#!/usr/bin/env python3
"""Differential check on the real public traces: slices of the WEKA coding-agent sessions,
RAGPulse and Mooncake (conversation and synthetic), with and without tenants' salts and LoRA,
through vLLM 0.25.1 (``oracle.py``) and apcsim, compared exactly as ``fuzz.py`` compares
(every request's ``hit_tokens``, ``num_preemptions`` and ``readmit_hit_tokens``, the summed
``PrefixCacheStats``, the step count).

DEV-ONLY, like ``fuzz.py`` (whose comparison it reuses). The random fuzz draws short synthetic
chats; these cases carry what only real traffic has: prompts of 10^4-10^5 tokens chunked over many
steps, hundreds of blocks per request, pools that a few such requests fill (the full-sequence gate,
preemption and re-admission of long contexts), the trace's own arrival bursts::

    PYTHONPATH=../.. python real_traces.py --out out/real [--only agent] [--limit-scale 0.5]
    PYTHONPATH=../.. python real_traces.py --fixtures ../../tests/fixtures/vllm_oracle/real   # CI's cases
    PYTHONPATH=../.. python real_traces.py --offload --out out/real_offload   # vLLM 0.33.0 + CPU tier
    PYTHONPATH=../.. python real_traces.py --vllm-version 0.33.0 \
        --fixtures ../../tests/fixtures/vllm_oracle_033/real                  # CI's slices, 0.33.0

``--offload`` runs ``OFFLOAD_CASES`` instead: the same kind of slices through vLLM 0.33.0 (``venv033``)
with its native CPU offloading (OffloadingConnector, the oracle's stub worker, K=1 unless set)
against apcsim's tier (``fuzz.apcsim_offload_side``: sim.core.step_driver + StepDelayWorker),
comparing also the CPU hits, steps waiting for KV, connector stats, prompt tokens by source and the
tier's counters. ``--vllm-version 0.33.0`` runs ``CASES`` (no tier) against 0.33.0.

Each case's canonical trace is written by apcsim's own loader (``workloads.build_workload`` then
``write_trace``), so both sides replay the same token ids; a disagreeing case keeps its trace,
settings and differences under ``--out``. ``report.json`` lists every case with its request count,
prompt tokens, steps, preemptions and outcome.

``--fixtures DIR`` runs the smaller slices of ``FIXTURES`` instead and, for each case on which both
sides agree -- apcsim replaying the written trace and also the loader's stream directly, as
``tests/test_vllm_agreement_real.py`` does -- writes vLLM's rows and stats and ``manifest.json``
(workload, limit, engine, the stream's digest, the oracle's command) into DIR. It refuses to write
anything if a case disagrees.
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fuzz import (  # noqa: E402
    apcsim_offload_side,
    apcsim_outcome,
    apcsim_side,
    differences,
    offload_argv,
    oracle_argv,
    read_report,
    start_oracle,
    submit,
    vllm_offload_side,
    vllm_side,
)

# (case name, workload section, request limit, engine settings); pools are in blocks, with the
# smallest chosen so that the largest request still fits (else both sides refuse, which agrees)
_ENGINE = dict(max_num_seqs=256, max_num_batched_tokens=8192, long_prefill_token_threshold=0, watermark=0.0,
               enable_chunked_prefill=True, policy="fcfs", async_scheduling=False, step_time=0.02)
_AGENT = {"kind": "agent_trace", "shared_prompt_fraction": 1.0, "arrival": {"kind": "poisson", "rate": 0.5}}
_AGENT_SALTED = {**_AGENT, "tenants": {"num_tenants": 4, "salt": "per_tenant", "lora_adapters": 2}}
_RAG = {"kind": "ragpulse", "arrival": {"kind": "trace", "rate_scale": 200.0}}
_RAG_PLP = {**_RAG, "tenants": {"num_tenants": 3, "salt": "per_user", "prompt_logprobs_fraction": 0.1}}
_MOON = {"kind": "mooncake", "time_scale": 20.0}
_MOON_SYN = {"kind": "mooncake", "path": "../../shared/traces/mooncake/synthetic_trace.jsonl", "time_scale": 20.0}

CASES: list[tuple[str, dict[str, Any], int, dict[str, Any]]] = [
    ("agent_bs64_sync_generous", _AGENT, 300, dict(block_size=64, num_gpu_blocks=40000)),
    ("agent_bs64_sync_tight", _AGENT, 300, dict(block_size=64, num_gpu_blocks=9000)),
    ("agent_bs64_async_tight", _AGENT, 300, dict(block_size=64, num_gpu_blocks=9000, async_scheduling=True)),
    ("agent_bs16_async_priority_tight", _AGENT, 200,
     dict(block_size=16, num_gpu_blocks=36000, async_scheduling=True, policy="priority")),
    ("agent_bs64_sync_salted_budget2048", _AGENT_SALTED, 300,
     dict(block_size=64, num_gpu_blocks=9000, max_num_batched_tokens=2048, long_prefill_token_threshold=512)),
    ("agent_bs64_async_salted_watermark", _AGENT_SALTED, 300,
     dict(block_size=64, num_gpu_blocks=10000, async_scheduling=True, watermark=0.01)),
    ("ragpulse_bs16_sync", _RAG, 600, dict(block_size=16, num_gpu_blocks=3000)),
    ("ragpulse_bs16_async_tight", _RAG, 600, dict(block_size=16, num_gpu_blocks=1200, async_scheduling=True)),
    ("ragpulse_bs32_sync_plp_salts", _RAG_PLP, 600, dict(block_size=32, num_gpu_blocks=800, max_num_seqs=32)),
    ("mooncake_bs16_sync_tight", _MOON, 300, dict(block_size=16, num_gpu_blocks=9000)),
    ("mooncake_bs16_async_tight", _MOON, 300, dict(block_size=16, num_gpu_blocks=9000, async_scheduling=True)),
    ("mooncake_bs512_sync", _MOON, 400, dict(block_size=512, num_gpu_blocks=600)),
    ("mooncake_synthetic_bs16_async_priority", _MOON_SYN, 300,
     dict(block_size=16, num_gpu_blocks=12000, async_scheduling=True, policy="priority")),
    # pools a small multiple of the largest request (pool_factor): preemption of long contexts
    ("mooncake_bs16_sync_preempting", _MOON, 300, dict(block_size=16, pool_factor=1.5)),
    ("mooncake_bs16_async_priority_preempting", _MOON, 300,
     dict(block_size=16, pool_factor=1.3, async_scheduling=True, policy="priority")),
    ("mooncake_bs64_async_threshold_preempting", _MOON, 300,
     dict(block_size=64, pool_factor=1.2, async_scheduling=True, long_prefill_token_threshold=2048, max_num_seqs=8)),
    ("agent_bs64_sync_preempting", _AGENT, 200, dict(block_size=64, pool_factor=1.2)),
    ("agent_bs64_async_priority_salted_preempting", _AGENT_SALTED, 200,
     dict(block_size=64, pool_factor=1.4, async_scheduling=True, policy="priority", max_num_batched_tokens=4096)),
    ("ragpulse_bs16_async_nochunk_preempting", _RAG, 600,
     dict(block_size=16, pool_factor=2.0, async_scheduling=True, enable_chunked_prefill=False)),
]


# vLLM 0.33.0 with a CPU offload tier: (case name, workload, request limit, engine settings, offload
# settings); issue 33's target first: Mooncake with 8,000 GPU blocks and 40,000 CPU chunks
_OFF = dict(blocks_per_chunk=1, policy="lru", offload_prompt_only=True, store_threshold=0, transfer_delay_steps=1)
OFFLOAD_CASES: list[tuple[str, dict[str, Any], int, dict[str, Any], dict[str, Any]]] = [
    ("mooncake_bs16_sync_lru_gpu8000_cpu40000", _MOON, 300, dict(block_size=16, num_gpu_blocks=8000),
     dict(_OFF, num_cpu_chunks=40000)),
    ("mooncake_bs16_sync_arc_gpu8000_cpu40000", _MOON, 300, dict(block_size=16, num_gpu_blocks=8000),
     dict(_OFF, num_cpu_chunks=40000, policy="arc")),
    ("mooncake_bs16_async_lru_gpu8000_cpu40000", _MOON, 300,
     dict(block_size=16, num_gpu_blocks=8000, async_scheduling=True), dict(_OFF, num_cpu_chunks=40000)),
    ("mooncake_bs16_async_arc_gpu8000_cpu40000", _MOON, 300,
     dict(block_size=16, num_gpu_blocks=8000, async_scheduling=True), dict(_OFF, num_cpu_chunks=40000, policy="arc")),
    ("mooncake_bs16_sync_arc_chunk64_threshold2_k3", _MOON, 300, dict(block_size=16, num_gpu_blocks=8000),
     dict(_OFF, num_cpu_chunks=6000, policy="arc", blocks_per_chunk=4, store_threshold=2, transfer_delay_steps=3)),
    # twice the requests (the conversations' reuse distance is ~1,100 rows; the largest of these
    # 600 requests needs 7,620 blocks, so 8,000 is about the smallest pool that serves them all)
    ("mooncake600_bs16_sync_lru_gpu8000_cpu40000", _MOON, 600, dict(block_size=16, num_gpu_blocks=8000),
     dict(_OFF, num_cpu_chunks=40000)),
    ("mooncake600_bs16_async_arc_gpu8000_cpu40000", _MOON, 600,
     dict(block_size=16, num_gpu_blocks=8000, async_scheduling=True), dict(_OFF, num_cpu_chunks=40000, policy="arc")),
    ("agent_bs64_sync_lru_tight", _AGENT, 200, dict(block_size=64, num_gpu_blocks=9000),
     dict(_OFF, num_cpu_chunks=30000)),
    ("agent_bs64_async_arc_salted", _AGENT_SALTED, 200,
     dict(block_size=64, num_gpu_blocks=10000, async_scheduling=True), dict(_OFF, num_cpu_chunks=20000, policy="arc")),
    ("ragpulse_bs16_async_lru_tight", _RAG, 600, dict(block_size=16, num_gpu_blocks=1200, async_scheduling=True),
     dict(_OFF, num_cpu_chunks=6000)),
    ("ragpulse_bs32_sync_arc_plp_salts_all_tokens", _RAG_PLP, 600,
     dict(block_size=32, num_gpu_blocks=800, max_num_seqs=32), dict(_OFF, num_cpu_chunks=2000, policy="arc",
                                                                     offload_prompt_only=False)),
]


# the fixture slices tests/test_vllm_agreement_real.py replays in CI (case -> request limit): sized
# for about a second of apcsim each, with preemptions, salts, LoRA, prompt logprobs, async, priority
FIXTURES: dict[str, int] = {
    "agent_bs64_sync_salted_budget2048": 60,
    "agent_bs16_async_priority_tight": 40,
    "ragpulse_bs16_async_tight": 300,
    "ragpulse_bs32_sync_plp_salts": 300,
    "ragpulse_bs16_async_nochunk_preempting": 300,
    "mooncake_bs16_sync_preempting": 150,
    "mooncake_bs64_async_threshold_preempting": 150,
    "mooncake_synthetic_bs16_async_priority": 150,
}


def write_case_trace(workload: dict[str, Any], limit: int, path: Path) -> tuple[int, int, int]:
    """The first ``limit`` requests of ``workload`` as a canonical trace; (requests, prompt tokens, longest
    prompt + output)."""
    from sim.experiment.config import config_from_dict
    from workloads.registry import build_workload
    from workloads.trace_format import write_trace

    cfg = config_from_dict({"name": "real", "workload": {**workload, "limit": limit}})
    wl = build_workload(cfg.workload, seed=cfg.seed, base_dir=str(HERE.parents[1] / "configs"))
    reqs = list(itertools.islice(wl.requests, limit))
    write_trace(path, reqs)
    return len(reqs), sum(len(r.tokens) for r in reqs), max(len(r.tokens) + r.output_tokens for r in reqs)


def fixture_case(name: str, workload: dict[str, Any], limit: int, e: dict[str, Any], case_dir: Path,
                 v_res: dict[str, Any], vllm_version: str = "0.25.1") -> dict[str, Any]:
    """The manifest entry of an agreeing case (its ``diff``: the direct replay's differences, if any);
    keeps vLLM's outputs in ``case_dir``. (0.33.0: no direct replay -- test_vllm_agreement_real's
    case_config replays the 0.25.1 profile; the written trace was compared under 0.33.0.)"""
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from test_vllm_agreement_real import CONFIGS, case_config, stream_digest

    from sim.experiment.run import replay_experiment
    from workloads.registry import build_workload

    case: dict[str, Any] = {"workload": workload, "limit": limit, "engine": e}
    cfg = case_config(case)
    wl = build_workload(cfg.workload, seed=cfg.seed, base_dir=CONFIGS)
    case["stream_sha256"] = stream_digest(itertools.islice(wl.requests, limit))
    case["diff"] = []
    if vllm_version == "0.25.1":
        res, _ = replay_experiment(cfg, progress=False)
        direct = apcsim_outcome(res)
        case["diff"] = [f"direct replay: {d}" for d in differences(v_res, direct, e["async_scheduling"])]
    argv = oracle_argv(Path(f"{name}.jsonl"), Path("."), e, [])
    case["oracle_command"] = " ".join(["python", "oracle.py", *argv])
    case["vllm"] = {"requests": len(v_res["rows"]), "steps": v_res["steps"],
                    "preemptions": sum(r[1] for r in v_res["rows"].values()),
                    "hit_tokens": sum(r[0] for r in v_res["rows"].values())}
    return case


def table(report: list[dict[str, Any]]) -> str:
    """The report as a Markdown table, one row per case."""
    lines = ["| case | requests | prompt tokens | block | sched | policy | pool blocks | steps | preemptions | "
             "hit tokens | agree |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report:
        e = r["engine"]
        lines.append(f"| {r['case']} | {r['requests']} | {r['prompt_tokens']:,} | {e['block_size']} | "
                     f"{'async' if e['async_scheduling'] else 'sync'} | {e['policy']} | {e['num_gpu_blocks']:,} | "
                     f"{r.get('steps', '-')} | {r.get('preemptions', '-')} | {r.get('hit_tokens', '-')} | "
                     f"{'yes' if r['agree'] else '**no**'} |")
    return "\n".join(lines) + "\n"


def write_fixtures(folder: Path, cases: dict[str, Any], out: Path, vllm_version: str = "0.25.1") -> None:
    """vLLM's rows and stats of every case, and the manifest, into ``folder`` (replaced whole)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name in cases:
        src = out / name
        shutil.copy(src / "vllm.csv", folder / f"{name}.csv")
        shutil.copy(src / "vllm.stats.json", folder / f"{name}.stats.json")
        shutil.rmtree(src)
    gen = "tools/vllm_oracle/real_traces.py --fixtures" + ("" if vllm_version == "0.25.1" else
                                                           f" --vllm-version {vllm_version}")
    manifest = {"vllm_version": vllm_version, "generator": gen, "cases": cases}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(cases)} fixture cases into {folder}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "out" / "real"))
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--limit-scale", type=float, default=1.0, help="scale every case's request count")
    ap.add_argument("--fixtures", default=None, help="write the FIXTURES slices' expected outputs into this folder")
    ap.add_argument("--results", default=None,
                    help="also keep the report as a results folder (report.json, table.md, meta.json)")
    ap.add_argument("--vllm-version", default="0.25.1", choices=["0.25.1", "0.33.0"])
    ap.add_argument("--offload", action="store_true", help="run OFFLOAD_CASES (vLLM 0.33.0 with a CPU tier)")
    ap.add_argument("--python", default=None, help="the oracle venv's python (default venv/ or venv033/)")
    a = ap.parse_args(argv)
    if a.offload:
        a.vllm_version = "0.33.0"
    if a.fixtures and a.offload:
        ap.error("--fixtures writes the no-connector slices (the offload fixtures: make_offload_fixtures.py)")
    a.python = a.python or str(HERE / ("venv" if a.vllm_version == "0.25.1" else "venv033") / "bin" / "python")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = None
    if a.results:  # opened (and checked writable) before the cases run
        sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))
        from bench_results import BenchFolder

        folder = BenchFolder(a.results, allowed=lambda name: name in ("report.json", "table.md"))
    try:
        return _run(a, out, folder)
    finally:
        if folder is not None:
            folder.close()  # releases the lock, drops the temporary folder if nothing was committed


def _run(a: argparse.Namespace, out: Path, folder: Any) -> int:
    proc = start_oracle(a.python)
    report: list[dict[str, Any]] = []
    bad = 0
    fixtures: dict[str, Any] = {}
    cases = OFFLOAD_CASES if a.offload else [(*c, None) for c in CASES]
    for name, workload, limit, settings, off in cases:
        if (a.only and a.only not in name) or (a.fixtures and name not in FIXTURES):
            continue
        t0 = time.time()
        case_dir = out / name
        case_dir.mkdir(exist_ok=True)
        tpath = case_dir / "trace.jsonl"
        limit = FIXTURES[name] if a.fixtures else max(1, int(limit * a.limit_scale))
        n, tokens, need = write_case_trace(workload, limit, tpath)
        e = {**_ENGINE, **settings, "max_model_len": need}
        factor = e.pop("pool_factor", None)
        if factor is not None:  # a multiple of the blocks the largest request needs (+ the null block)
            e["num_gpu_blocks"] = int(factor * -(-need // e["block_size"])) + 1
        if not e["enable_chunked_prefill"]:  # vLLM refuses a budget below max_model_len without chunking
            e["max_num_batched_tokens"] = max(e["max_num_batched_tokens"], need)
        submit(proc, name, oracle_argv(tpath, case_dir, e, offload_argv(off, e["block_size"]) if off else []))
        # meanwhile vLLM runs the same case
        a_res = (apcsim_offload_side(tpath, e, off, check=False) if off  # no per-step integrity check
                 else apcsim_side(tpath, e, a.vllm_version))
        rep = read_report(proc)
        v_res = vllm_offload_side(case_dir, rep) if off else vllm_side(case_dir, rep)
        diff = differences(v_res, a_res, e["async_scheduling"])
        if a.fixtures and not diff:
            fixtures[name] = fixture_case(name, workload, limit, e, case_dir, v_res, a.vllm_version)
            diff = fixtures[name].pop("diff")
        row: dict[str, Any] = {"case": name, "requests": n, "prompt_tokens": tokens, "engine": e, "offload": off,
                               "seconds": round(time.time() - t0, 1), "agree": not diff}
        if "error" in v_res:
            row["refused"] = v_res["error"][:200]
        else:
            rows = v_res["rows"].values()
            row |= {"steps": v_res["steps"], "preemptions": sum(r[1] for r in rows),
                    "hit_tokens": sum(r[0] for r in rows), "stats": v_res["stats"]}
            if off:
                row |= {"external_hit_tokens": sum(r[3] for r in rows), "cpu_tier": v_res["extra"]["cpu_tier"]}
        print(json.dumps({k: v for k, v in row.items() if k not in ("engine", "stats", "offload")}), flush=True)
        if diff:
            bad += 1
            row["diff"] = diff[:50]
            (case_dir / "settings.json").write_text(json.dumps({"engine": e, "offload": off, "diff": diff}, indent=1))
        elif not a.fixtures:
            shutil.rmtree(case_dir)
        report.append(row)
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=120)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(report)} cases, {bad} disagreeing")
    if a.fixtures and not bad:
        write_fixtures(Path(a.fixtures), fixtures, out, a.vllm_version)
    if folder is not None:
        path = folder.write({"report.json": report, "table.md": table(report)},
                            {"tool": "tools/vllm_oracle/real_traces.py", "vllm_version": a.vllm_version,
                             "argv": sys.argv[1:], "cases": len(report), "disagreeing": bad})
        print(f"results: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
