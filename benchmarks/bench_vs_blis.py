"""Benchmark: apcsim against BLIS, side by side, on the first 4,000 Mooncake conversation requests.

Builds the canonical token JSONL (``{"id", "arrival", "tokens", "output_tokens"}``, 53 M prompt
tokens, about 450 MB) from the Mooncake conversation trace, then -- for each pool size -- runs the
BLIS harness of ``--peers`` (``../shared/peers`` by default; see its README for the set-up) and
``apcsim run`` on it alternately, ``--repeat`` times each, in fresh processes, with the same
settings: block size 16, fixed 20 ms steps, 8,192-token budget, 256 sequences, the same number of
blocks (BLIS's are all usable; vLLM's block 0 is the null block); apcsim writes its parquet tables
and skips the offline bounds (``--no-bounds``), as BLIS computes none. Prints per run the CPU seconds
(user + system of the process), wall seconds and peak RSS, the medians side by side with their
ratio against the targets (CPU <= 0.5x BLIS at 52,001 blocks, <= 0.1x at 8,000; RSS no higher),
and the per-request agreement of first-admission hit tokens. Beside every apcsim run a fresh
process times apcsim's loading of the input alone (``load_time.py``), set against the harness's
own load phase (wall seconds both; target: under 0.25x). Without a set-up BLIS harness only
apcsim runs. The machine's load average is printed before and after: share the cores with other
jobs and the absolute times grow, so read the ratios of one run.

With ``--out DIR`` the figures are also kept as a results folder, replaced whole or not at all
(``sim.experiment.results_folder``): ``runs.json`` (every run of both tools), ``medians.json`` (one
row per pool size, as printed), ``table.md`` (the printed table), ``apcsim_<blocks>.json`` (the
apcsim configs) and ``meta.json`` last (commit, package versions, CPU model, load averages, the
BLIS commit and harness settings, ``complete: true``).

    python benchmarks/bench_vs_blis.py [--peers DIR] [--blocks 52001 8000] [--repeat 3] [--work DIR] [--out DIR]

There is no fleet row: ``--fleet`` prints why the fleet setups cannot be matched yet (issue 38 item 5;
``fleet_blockers``, docs/benchmarks.md "No fleet row against BLIS") and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_results import BenchFolder, compile_bytecode, run_with_folder

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {52001: 0.5, 8000: 0.1}  # CPU-time ratio apcsim / BLIS the issue asks for
LOAD_TARGET = 0.25  # apcsim's loading of the input against BLIS's load phase (wall seconds)
MEDIANS = {"blis": ("cpu_s", "wall_s", "rss_mib", "load_wall_s", "run_wall_s"),
           "apcsim": ("cpu_s", "wall_s", "rss_mib", "load_cpu_s", "load_wall_s")}


def build_input(trace: Path, n: int, out: Path) -> Path:
    """The first ``n`` requests of the Mooncake trace as canonical JSONL (expanded token ids)."""
    if out.exists():
        return out
    sys.path.insert(0, str(ROOT))
    from sim.core.request import token_array
    from workloads.mooncake import load_mooncake
    from workloads.trace_format import TraceRequest, write_trace

    reqs = (TraceRequest(f"mc{i}", r.arrival, token_array(r.tokens), r.output_tokens)
            for i, r in enumerate(load_mooncake(trace, limit=n)))
    tmp = out.with_suffix(".tmp")
    write_trace(tmp, reqs)
    tmp.replace(out)
    return out


def measure(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, float]:
    """Run ``cmd``; its own CPU seconds, wall seconds and peak RSS (``wait4`` rusage)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[0]} failed:\n{out.decode(errors='replace')[-3000:]}")
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": wall, "rss_mib": ru.ru_maxrss / 1024}


def load_time(cfg: Path, env: dict[str, str]) -> dict[str, float]:
    """apcsim's loading of ``cfg``'s input in a fresh process (``load_time.py``): CPU and wall seconds."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "load_time.py"), str(cfg)], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"load_time.py failed:\n{(out.stdout + out.stderr)[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"load_cpu_s": r["load_cpu_s"], "load_wall_s": r["load_wall_s"]}


def apcsim_config(path: Path, trace: Path, blocks: int, out: Path) -> Path:
    cfg = {
        "name": f"vs_blis_{blocks}",
        "output_dir": str(out),
        # BLIS has no max_model_len; vLLM refuses a pool that cannot hold one max_model_len sequence,
        # so a small pool gets the longest length it can hold (the longest request, 123,192 prompt
        # tokens, still fits at 8,000 blocks)
        "engine": {"block_size": 16, "num_gpu_blocks": blocks, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
                   "max_model_len": min(131072, (blocks - 1) * 16)},
        "latency": {"kind": "fixed", "step_time_s": 0.02},
        "workload": {"kind": "trace", "path": str(trace)},
        "replay": {"progress": False},
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def hit_agreement(blis_out: Path, apcsim_dir: Path) -> tuple[int, int, int, int]:
    """(requests with equal first-admission hit tokens, common requests, BLIS total, apcsim total)."""
    import pandas as pd

    blis = {}
    for line in blis_out.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            blis[str(r["id"])] = r.get("hit_tokens")
    df = pd.read_parquet(apcsim_dir / "requests.parquet", columns=["request_id", "hit_tokens"])
    ours = dict(zip(df["request_id"].astype(str), df["hit_tokens"]))
    common = [i for i in blis if i in ours]
    equal = sum(1 for i in common if blis[i] is not None and int(blis[i]) == int(ours[i]))
    return equal, len(common), sum(int(blis[i] or 0) for i in common), sum(int(ours[i]) for i in common)


BLIS_COMMIT = "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"  # the commit the harness and the reasons below were read at
# why BLIS's cluster mode cannot replay this benchmark's input; file paths in BLIS at BLIS_COMMIT
CLI_TRACE_REASON = (
    "BLIS's own multi-instance runs (`blis run` / `blis replay --num-instances K`, cmd/root.go:2181, "
    "cmd/replay.go:583) replay a TraceV2 CSV whose rows carry token COUNTS and one "
    "prefix_group/prefix_length (sim/workload/tracev2.go TraceRecord); sim/workload/replay.go:64-78 "
    "draws random token ids per request, shared only inside a prefix group (or a session's growing "
    "context, tracev2.go:32-34), so Mooncake's per-request block chains (partial overlaps with many "
    "earlier requests) cannot be written in it: the same trace cannot be replayed through the CLI")
ROUTER_REASON = (
    "router families differ in what they read: round robin matches (BLIS `round-robin`: request N to "
    "instance N % k; apcsim `round_robin`); prefix-aware does not yet: BLIS `precise-prefix-cache` reads "
    "each instance's block table itself (live GetCachedBlocks at --cache-signal-delay 0, else a "
    "HashToBlock snapshot refreshed every 50 ms) with load signals refreshed every "
    "--snapshot-refresh-interval (50 ms) (cmd/root.go:1172-1173, sim/routing_precise_prefix_scorer.go), "
    "apcsim `llm_d` precise reads an index fed by vLLM KV events; BLIS `prefix-affinity` hashes 16-token "
    "blocks into a 10,000-entry LRU per instance (sim/routing_prefix_scorer.go:5,21), apcsim's llm-d "
    "approximate scorer 64-token blocks into 31,250 entries")


def fleet_blockers(peers: Path) -> list[str]:
    """Why this benchmark has no fleet row against BLIS: the harness's state in ``peers``, then the rest."""
    reasons = []
    main_go = peers / "blis_harness" / "main.go"
    source = main_go.read_text(errors="replace") if main_go.is_file() else ""
    if "NewClusterSimulator" not in source:
        reasons.append(f"the harness ({main_go if source else peers / 'blis_harness'}: "
                       f"{'drives one sim.NewSimulator' if source else 'absent'}) has no cluster mode; one would "
                       "call cluster.NewClusterSimulator(config, cluster.NewSliceRequestSource(reqs), nil) with "
                       "the trace's token ids, and it is not written")
    harness = peers / "blis_harness" / "blisharness"
    if not (harness.is_file() and os.access(harness, os.X_OK)):
        reasons.append(f"no built harness at {harness} (no Go toolchain here: see {peers / 'README.md'} set-up)")
    return [*reasons, CLI_TRACE_REASON, ROUTER_REASON]


def fleet_report(peers: Path) -> str:
    """The lines ``--fleet`` prints: no row, and every reason."""
    return "\n".join(["fleet row against BLIS: NOT MEASURED -- the setups cannot be matched yet:",
                      *(f"  - {r}" for r in fleet_blockers(peers)),
                      f"  (BLIS sources read at {BLIS_COMMIT}; docs/benchmarks.md, 'No fleet row against BLIS')"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=str(ROOT.parent / "shared" / "peers"), help="the BLIS harness folder")
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"))
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--blocks", type=int, nargs="+", default=[52001, 8000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default=None, help="folder for the input and outputs (default: a temp dir, kept)")
    ap.add_argument("--out", default=None, help="also keep the figures as this results folder (replaced whole)")
    ap.add_argument("--fleet", action="store_true", help="the fleet row: prints why it cannot be matched, exits 1")
    args = ap.parse_args()
    if args.fleet:
        print(fleet_report(Path(args.peers)))
        raise SystemExit(1)
    run_with_folder(args.out, _ours, lambda f: _bench(args, f))


def _bench(args: argparse.Namespace, folder: BenchFolder | None) -> None:
    compile_bytecode()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_vs_blis_"))
    work.mkdir(parents=True, exist_ok=True)
    trace = build_input(Path(args.trace), args.requests, work / f"mc{args.requests}.jsonl")
    peers = Path(args.peers)
    harness = peers / "blis_harness" / "blisharness"
    have_blis = harness.is_file() and os.access(harness, os.X_OK)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"input {trace} ({trace.stat().st_size / 2**20:.0f} MiB, {args.requests} requests); "
          f"BLIS harness: {harness if have_blis else 'not set up (run its setup.sh): apcsim only'}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    rows = []
    all_runs: dict[int, dict[str, list[dict[str, float]]]] = {}
    for blocks in args.blocks:
        runs: dict[str, list[dict[str, float]]] = {"blis": [], "apcsim": []}
        cfg = apcsim_config(work / f"apcsim_{blocks}.json", trace, blocks, work / "apcsim_out")
        blis_out = work / f"blis_{blocks}.jsonl"
        for i in range(args.repeat):
            if have_blis:
                r = measure([str(harness), "-i", str(trace), "-o", str(blis_out), "-summary",
                             str(blis_out.with_suffix(".sum.json")), "-kv-blocks", str(blocks)], cwd=peers)
                summary = json.loads(blis_out.with_suffix(".sum.json").read_text())
                r["load_wall_s"], r["run_wall_s"] = summary.get("load_seconds"), summary.get("run_seconds")
                runs["blis"].append(r)
                print(f"  {blocks} blocks, BLIS   run {i + 1}: cpu {r['cpu_s']:.2f} s, wall {r['wall_s']:.2f} s, "
                      f"rss {r['rss_mib']:.0f} MiB; its load phase: wall {r['load_wall_s']:.2f} s", flush=True)
            # --no-bounds: BLIS only replays; apcsim's offline references (Belady, LRU, infinite
            # cache) for the run's diagnosis would re-read the trace three more times
            r = measure([sys.executable, "-m", "sim.cli", "run", str(cfg), "--no-progress", "--no-bounds"],
                        env=env, cwd=ROOT)
            r.update(load_time(cfg, env))
            runs["apcsim"].append(r)
            print(f"  {blocks} blocks, apcsim run {i + 1}: cpu {r['cpu_s']:.2f} s, wall {r['wall_s']:.2f} s, "
                  f"rss {r['rss_mib']:.0f} MiB; loading the input (apart): cpu {r['load_cpu_s']:.2f} s, "
                  f"wall {r['load_wall_s']:.2f} s", flush=True)
        med = {k: {m: statistics.median(x[m] for x in v) for m in MEDIANS[k] if all(x.get(m) is not None for x in v)}
               for k, v in runs.items() if v}
        row = {"blocks": blocks, **{f"apcsim_{m}": v for m, v in med["apcsim"].items()}}
        if have_blis:
            row.update({f"blis_{m}": v for m, v in med["blis"].items()})
            row["cpu_ratio"] = med["apcsim"]["cpu_s"] / med["blis"]["cpu_s"]
            if "load_wall_s" in med["blis"]:
                # wall against wall: the harness times its load phase with a wall clock
                row["load_ratio"] = med["apcsim"]["load_wall_s"] / med["blis"]["load_wall_s"]
            row["hits_equal"], row["common"], row["blis_hits"], row["apcsim_hits"] = hit_agreement(
                blis_out, work / "apcsim_out" / f"vs_blis_{blocks}")
        rows.append(row)
        all_runs[blocks] = runs
        print(json.dumps(row), flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    table = _table(rows, args.repeat)
    print("\n" + table)
    print(f"work folder: {work}")
    if folder is not None:
        files: dict[str, Any] = {"runs.json": {str(b): r for b, r in all_runs.items()}, "medians.json": rows,
                                 "table.md": table}
        for blocks in args.blocks:
            files[f"apcsim_{blocks}.json"] = (work / f"apcsim_{blocks}.json").read_text()
        blis_commit = peers / "blis_src" / "BLIS_COMMIT"
        meta = {
            "benchmark": "bench_vs_blis", "requests": args.requests, "blocks": args.blocks, "repeat": args.repeat,
            "input": {"trace": str(args.trace), "bytes": trace.stat().st_size},
            "blis": {"harness": str(harness) if have_blis else None,
                     "commit": blis_commit.read_text().strip() if blis_commit.is_file() else None,
                     "settings": {"block_size": 16, "step_s": 0.02, "max_num_batched_tokens": 8192,
                                  "max_num_seqs": 256}},
        }
        print(f"results folder: {folder.write(files, meta)}")


def _table(rows: list[dict[str, Any]], repeat: int) -> str:
    """The printed side-by-side table (markdown) of the medians."""
    lines = [f"medians of {repeat} alternating runs (CPU = user + system seconds of the process)", "",
             "| blocks | BLIS CPU s | apcsim CPU s | ratio (target) | BLIS wall s | apcsim wall s | BLIS peak RSS "
             "| apcsim peak RSS | hit tokens equal per request |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "cpu_ratio" not in r:
            lines.append(f"| {r['blocks']:,} | - | {r['apcsim_cpu_s']:.2f} | - | - | {r['apcsim_wall_s']:.2f} | - | "
                         f"{r['apcsim_rss_mib']:.0f} MiB | - |")
            continue
        target = TARGETS.get(r["blocks"])
        met = "" if target is None else f" ({'<=' if r['cpu_ratio'] <= target else 'NOT <='} {target}: " \
            f"{'met' if r['cpu_ratio'] <= target else 'missed'})"
        rss = "met" if r["apcsim_rss_mib"] <= r["blis_rss_mib"] else "missed"
        lines.append(f"| {r['blocks']:,} | {r['blis_cpu_s']:.2f} | {r['apcsim_cpu_s']:.2f} | "
                     f"{r['cpu_ratio']:.2f}{met} | {r['blis_wall_s']:.2f} | {r['apcsim_wall_s']:.2f} | "
                     f"{r['blis_rss_mib']:.0f} MiB | "
                     f"{r['apcsim_rss_mib']:.0f} MiB (RSS target {rss}) | {r['hits_equal']}/{r['common']} |")
    loads = [r for r in rows if "load_ratio" in r]
    if loads:
        lines += ["", "loading the same input, medians (BLIS: its harness's load phase, from opening the file to the "
                  "last request injected; apcsim: its workload's whole request stream read in a fresh process)", "",
                  "| blocks | BLIS load wall s | apcsim load wall s | ratio (target) | apcsim load CPU s |",
                  "|---|---|---|---|---|"]
        for r in loads:
            met = r["load_ratio"] < LOAD_TARGET
            lines.append(f"| {r['blocks']:,} | {r['blis_load_wall_s']:.2f} | {r['apcsim_load_wall_s']:.2f} | "
                         f"{r['load_ratio']:.2f} ({'<' if met else 'NOT <'} {LOAD_TARGET}: "
                         f"{'met' if met else 'missed'}) | {r['apcsim_load_cpu_s']:.2f} |")
    return "\n".join(lines) + "\n"


def _ours(name: str) -> bool:
    """A file this benchmark's results folder holds (an older one of these is replaced whole)."""
    return name in ("runs.json", "medians.json", "table.md") or (
        name.startswith("apcsim_") and name.endswith(".json") and name[7:-5].isdigit())


if __name__ == "__main__":
    main()
