#!/usr/bin/env python3
"""Regenerate ``tests/fixtures/vllm_oracle_033/offload/``: vLLM 0.33.0's own Scheduler with its
native CPU offloading (OffloadingConnector over CPUOffloadingManager, LRU / ARC) and the oracle's
stub worker (``offload_stub.StubWorker``: a job of batch b reports in the output of batch b+K), on

* the hand-made cases of ``selfcheck_offload/`` (their ``<name>.jsonl`` traces are copied), and
* a Mooncake slice: the rows of the first conversations of the bundled sample
  (``workloads/data/mooncake_conversation_sample.jsonl``) rewritten as a smaller Mooncake file
  (``mooncake_slice.jsonl``: ``input_length`` scaled to ``tokens_per_id`` tokens per hash id,
  ``output_length`` capped), so that apcsim's own loader (workload ``{"kind": "mooncake", "path":
  "mooncake_slice.jsonl", "tokens_per_id": T, "time_scale": S}``) gives exactly the token ids the
  oracle replayed (this script builds the oracle's trace with that loader).

DEV-ONLY. Run it with apcsim's venv (it imports ``workloads``); it drives ``venv033``'s oracle in
one ``--batch`` process::

    cd tools/vllm_oracle && ./setup.sh --version 0.33.0
    ../../.venv/bin/python make_offload_fixtures.py [--out ../../tests/fixtures/vllm_oracle_033/offload]

``manifest.json``: per case the trace (``trace``: a canonical JSONL, or ``workload``: the
Mooncake section above), the engine settings (the keys of the 0.25.1 agreement manifest), the
``offload`` settings (``num_cpu_chunks, blocks_per_chunk, policy, offload_prompt_only,
store_threshold, transfer_delay_steps``), the expected CSV / stats files and the oracle command.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "vllm_oracle_033" / "offload"
SAMPLE = REPO / "workloads" / "data" / "mooncake_conversation_sample.jsonl"

# the Mooncake slice: rows of the first CONVERSATIONS conversations (keyed by hash_ids[1], as
# mooncake_to_jsonl.py does) among the sample's first ROWS rows, at most COUNT of them
MOON = dict(rows=1000, conversations=150, count=300, tokens_per_id=16, max_output=32, time_scale=0.02)

_ENGINE = dict(block_size=16, max_num_batched_tokens=8192, max_num_seqs=256, enable_chunked_prefill=True,
               long_prefill_token_threshold=0, watermark=0.0, policy="fcfs", async_scheduling=False,
               step_time=0.01)
_OFF = dict(blocks_per_chunk=1, policy="lru", offload_prompt_only=True, store_threshold=0,
            transfer_delay_steps=1)

# Mooncake cases: (name, engine overrides, offload overrides); a GPU pool of 400 blocks (about a
# tenth of the slice's distinct blocks, the largest request is 241 blocks) and a CPU tier 5x that
MOON_CASES = [
    ("mooncake_lru_sync", dict(num_gpu_blocks=400), dict(num_cpu_chunks=2000)),
    ("mooncake_arc_sync", dict(num_gpu_blocks=400), dict(num_cpu_chunks=2000, policy="arc")),
    ("mooncake_lru_async", dict(num_gpu_blocks=400, async_scheduling=True), dict(num_cpu_chunks=2000)),
    ("mooncake_arc_async", dict(num_gpu_blocks=400, async_scheduling=True),
     dict(num_cpu_chunks=2000, policy="arc")),
    # a small CPU tier (allocation failures, evictions), 2-block chunks, a store threshold, K=2
    ("mooncake_arc_sync_chunk32_threshold2_k2", dict(num_gpu_blocks=400),
     dict(num_cpu_chunks=300, policy="arc", blocks_per_chunk=2, store_threshold=2, transfer_delay_steps=2)),
    # decode KV stored too (offload_prompt_only False), LRU, async, a tight CPU tier
    ("mooncake_lru_async_all_tokens", dict(num_gpu_blocks=400, async_scheduling=True),
     dict(num_cpu_chunks=600, offload_prompt_only=False)),
    # one CPU chunk: the tier is almost useless, but async scheduling with a (consumer) connector
    # defers block frees (Scheduler.defer_block_free), which changes GPU results
    ("mooncake_lru_async_cpu1", dict(num_gpu_blocks=400, async_scheduling=True), dict(num_cpu_chunks=1)),
    # the same slice and pool without a connector ("offload": null), sync and async: the untiered baseline
    ("mooncake_none_sync", dict(num_gpu_blocks=400), None),
    ("mooncake_none_async", dict(num_gpu_blocks=400, async_scheduling=True), None),
]


def write_mooncake_slice(path: Path) -> int:
    """The derived Mooncake file; returns its number of rows."""
    t = MOON["tokens_per_id"]
    keys: set = set()
    n = 0
    with open(SAMPLE) as fin, open(path, "w") as fout:
        for i, line in enumerate(fin):
            if i >= MOON["rows"] or n >= MOON["count"]:
                break
            row = json.loads(line)
            h = row["hash_ids"]
            key = h[1] if len(h) > 1 else ("single", h[0])
            if key not in keys:
                if len(keys) >= MOON["conversations"]:
                    continue
                keys.add(key)
            n_in = -(-row["input_length"] * t // 512)
            assert math.ceil(n_in / t) == len(h)
            rec = {"timestamp": row["timestamp"], "input_length": n_in,
                   "output_length": max(1, min(row["output_length"], MOON["max_output"])), "hash_ids": h}
            fout.write(json.dumps(rec, separators=(",", ":")) + "\n")
            n += 1
    return n


def canonical_from_mooncake(src: Path, dst: Path) -> tuple[int, int, int]:
    """apcsim's own loader (workloads.mooncake.load_mooncake) -> canonical JSONL for the oracle."""
    sys.path.insert(0, str(REPO))
    from workloads.mooncake import load_mooncake
    from workloads.trace_format import write_trace

    reqs = list(load_mooncake(src, tokens_per_id=MOON["tokens_per_id"], time_scale=MOON["time_scale"]))
    write_trace(dst, reqs)
    return len(reqs), sum(len(r.tokens) for r in reqs), max(len(r.tokens) + r.output_tokens for r in reqs)


def oracle_argv(trace: str, name: str, e: dict, o: dict) -> list[str]:
    argv = [trace, "--out", f"{name}.csv", "--stats-out", f"{name}.stats.json",
            "--block-size", e["block_size"], "--num-gpu-blocks", e["num_gpu_blocks"],
            "--max-model-len", e["max_model_len"], "--max-num-batched-tokens", e["max_num_batched_tokens"],
            "--max-num-seqs", e["max_num_seqs"], "--policy", e["policy"],
            "--long-prefill-token-threshold", e["long_prefill_token_threshold"], "--watermark", e["watermark"],
            "--step-time", e["step_time"], "--hash-algo", "sha256", "--hash-seed", "0", "--quiet", "--free-empty"]
    if o is not None:
        argv += ["--cpu-chunks", o["num_cpu_chunks"], "--offload-policy", o["policy"],
                 "--offload-block-size", o["blocks_per_chunk"] * e["block_size"],
                 "--store-threshold", o["store_threshold"], "--transfer-delay-steps", o["transfer_delay_steps"]]
        if not o["offload_prompt_only"]:
            argv.append("--offload-all-tokens")
    if not e["enable_chunked_prefill"]:
        argv.append("--no-chunked-prefill")
    if e["async_scheduling"]:
        argv += ["--async", "--free-drain"]
    return [str(x) for x in argv]


def hand_case(args: list[str]) -> tuple[dict, dict]:
    """Engine / offload settings of a selfcheck_offload case from its oracle args."""
    e = dict(_ENGINE)
    o = dict(_OFF)
    it = iter(args)
    for a in it:
        if a == "--num-gpu-blocks":
            e["num_gpu_blocks"] = int(next(it))
        elif a == "--cpu-chunks":
            o["num_cpu_chunks"] = int(next(it))
        elif a == "--offload-policy":
            o["policy"] = next(it)
        elif a == "--transfer-delay-steps":
            o["transfer_delay_steps"] = int(next(it))
        elif a == "--async":
            e["async_scheduling"] = True
        else:
            raise ValueError(f"unexpected selfcheck_offload arg {a}")
    return e, o


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--python", default=str(HERE / "venv033" / "bin" / "python"), help="venv033's python")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "_scratch"
    scratch.mkdir(exist_ok=True)

    subprocess.run([sys.executable, str(HERE / "selfcheck_offload" / "make_traces.py")], check=True)
    hand = json.load(open(HERE / "selfcheck_offload" / "expected.json"))
    manifest: dict = {"vllm_version": "0.33.0", "oracle": "tools/vllm_oracle/oracle.py",
                      "generator": "tools/vllm_oracle/make_offload_fixtures.py",
                      "stub_worker": "a load/store job of batch b is reported complete in the KVConnectorOutput "
                                     "of batch b + transfer_delay_steps (completed_jobs; async loads also in "
                                     "finished_recving); jobs_to_flush of batch b in batch b itself",
                      "cases": {}}
    jobs = []
    traces_seen: dict[str, str] = {}
    for name, c in hand.items():
        e, o = hand_case(c["args"])
        src = HERE / "selfcheck_offload" / f"{name}.jsonl"
        body = src.read_text()
        # cases sharing one trace (sync/async, lru/arc) keep one copy
        tname = traces_seen.setdefault(body, f"{name}.jsonl")
        if tname == f"{name}.jsonl":
            shutil.copy(src, out / tname)
        rows = [json.loads(x) for x in body.splitlines() if x.strip()]
        e["max_model_len"] = max(len(r["tokens"]) + r["output_tokens"] for r in rows)
        argv = oracle_argv(tname, name, e, o)
        jobs.append({"name": name, "argv": argv})
        manifest["cases"][name] = {"trace": tname, "expected_csv": f"{name}.csv",
                                   "expected_stats": f"{name}.stats.json", "engine": e, "offload": o,
                                   "selfcheck_expect": c["expect"],
                                   "oracle_command": "python oracle.py " + shlex.join(argv)}

    n_rows = write_mooncake_slice(out / "mooncake_slice.jsonl")
    n_req, n_tok, need = canonical_from_mooncake(out / "mooncake_slice.jsonl", scratch / "mooncake.jsonl")
    assert n_req == n_rows
    workload = {"kind": "mooncake", "path": "mooncake_slice.jsonl", "tokens_per_id": MOON["tokens_per_id"],
                "time_scale": MOON["time_scale"]}
    for name, eo, oo in MOON_CASES:
        e = dict(_ENGINE, max_model_len=need, **eo)
        o = dict(_OFF, **oo) if oo is not None else None
        argv = oracle_argv("_scratch/mooncake.jsonl", name, e, o)
        jobs.append({"name": name, "argv": argv})
        manifest["cases"][name] = {"workload": workload, "requests": n_req, "prompt_tokens": n_tok,
                                   "expected_csv": f"{name}.csv", "expected_stats": f"{name}.stats.json",
                                   "engine": e, "offload": o,
                                   "oracle_command": "python oracle.py " + shlex.join(
                                       ["<the slice through workloads.mooncake.load_mooncake, as JSONL>",
                                        *argv[1:]])}

    jobs_path = out / "_jobs.jsonl"
    with open(jobs_path, "w") as f:
        for j in jobs:
            f.write(json.dumps(j) + "\n")
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    rep = subprocess.run([a.python, str(HERE / "oracle.py"), "--batch", jobs_path.name, "--quiet"], cwd=out,
                         env=env, capture_output=True, text=True)
    jobs_path.unlink()
    shutil.rmtree(scratch)
    failed = False
    for line in rep.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            print(r["name"], "ok" if r["ok"] else r["error"], r.get("summary", ""), r.get("seconds"))
            failed |= not r["ok"]
    if rep.returncode or failed:
        print(rep.stderr[-3000:], file=sys.stderr)
        return 1
    for name in manifest["cases"]:  # drop timings that vary run to run
        p = out / f"{name}.stats.json"
        st = json.load(open(p))
        st.pop("build_seconds", None)
        st.pop("replay_seconds", None)
        p.write_text(json.dumps(st, indent=1, sort_keys=True) + "\n")
    with open(out / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
