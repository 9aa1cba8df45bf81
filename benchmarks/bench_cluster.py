"""Benchmark: the full Mooncake conversation trace on 16 replicas behind a router, one process.

Prints, per router: wall and CPU time, simulated seconds per wall second, peak RSS, hit rate,
TTFT p50, steps, KV events delivered, and the ratio of its CPU time to the single-engine replay of
the same trace (``benchmarks/bench_mooncake.py``'s setting: block 16, the pool vLLM would allocate
for Llama-3-8B on an H100, roofline latency). Each run is a fresh process, so its peak RSS is its own.

    python benchmarks/bench_cluster.py [--routers dynamo llm_d] [--replicas 16] [--limit N] [--no-single]
        [--case fleet|ratio|idle|scale] [--repeat N] [--tree DIR] [--out DIR]

A router name ending in ``+pd`` (``dynamo+pd``) replays the same fleet disaggregated: half the
replicas prefill, half decode, 50 GB/s per decode replica's link (``cluster.disaggregation``), the
cost of disaggregation beside the plain fleet's row. One ending in ``+store`` (``mooncake+store``)
gives the fleet a shared KV store (``cluster.kv_store``: 1 TiB, LRU, 25 GB/s each way per replica),
the cost of the store beside the plain fleet's row.

Cases (issue 38), each printing its targets met or missed:

* ``fleet`` (the default): the setting above; target (item 2): under 15 s of CPU per router;
* ``ratio``: the first 2,000 requests on 16 replicas beside the single engine on the same requests;
  target (item 2): each router's CPU under 2x the single engine's (medians of ``--repeat`` runs);
* ``idle``: 1,000 replicas serving the first 60 requests (``--replicas``/``--limit`` override), no
  single-engine run; target: under 500 MB peak RSS and under 5 s of wall time (a replica that gets
  no request builds no engine: ``sim.cluster.replica``);
* ``scale``: 256 replicas on the trace sped up 16x (``workload.arrival.rate_scale: 16``); target:
  under 120 s of wall time and 4 GB peak RSS.

``--repeat N`` runs every setting N times, alternating; ``--tree DIR`` also times another checkout
(its packages on ``PYTHONPATH``, e.g. a clone at an older commit built the same way), alternating
with this one, so the two sit side by side in the same minutes (rows tagged ``tree``).
``--out DIR`` also keeps the figures as a results folder, replaced whole (``bench_results``):
``rows.json`` (every run), ``table.md`` and ``meta.json`` (commit, versions, CPU model, load
averages, the arguments).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from bench_results import BenchFolder, bench_trees, child_json, markdown_table, run_with_folder

CASES = {  # replicas, limit, rate scale, targets (wall seconds, peak RSS MiB)
    "fleet": (16, None, 1.0, None),
    "ratio": (16, 2000, 1.0, None),
    "idle": (1000, 60, 1.0, (5.0, 500 * 1e6 / 2**20)),
    "scale": (256, None, 16.0, (120.0, 4 * 1e9 / 2**20)),
}


def _one(router: str, replicas: int, limit: int | None, rate_scale: float = 1.0) -> dict:
    from sim.experiment.config import config_from_dict
    from sim.experiment.run import replay_experiment

    data: dict = {"name": "bench", "engine": {"block_size": 16}, "workload": {"kind": "mooncake", "limit": limit}}
    if rate_scale != 1.0:
        data["workload"]["arrival"] = {"kind": "trace", "rate_scale": rate_scale}
    if router != "single":
        name, pd, _ = router.partition("+pd")
        name, store, _ = name.partition("+store")
        kind, _, prefix = name.partition(":")
        rc: dict = {"kind": kind}
        if prefix:
            rc["prefix"] = prefix
        data["cluster"] = {"replicas": replicas, "router": rc}
        if store:  # a KV store the fleet shares (sim.cluster.kv_store)
            data["cluster"]["kv_store"] = {"capacity_gib": 1024, "read_gb_s": 25.0, "write_gb_s": 25.0}
        if pd:  # half prefill, half decode (sim.cluster.disagg)
            data["cluster"]["disaggregation"] = {"prefill": replicas // 2, "decode": replicas - replicas // 2,
                                                 "link_gb_s": 50.0}
    cfg = config_from_dict(data)
    t0, c0 = time.perf_counter(), time.process_time()
    res, _ = replay_experiment(cfg, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary
    kv = s.get("cluster", {}).get("kv_events", {})
    return {
        "router": router, "replicas": replicas if router != "single" else 1, "requests": s["num_requests"],
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 2), "sim_s_per_wall_s": round(s["sim_time_s"] / wall, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "token_hit_rate": round(s["token_hit_rate"], 4), "ttft_p50_s": round(s["ttft_p50_s"], 3),
        "steps": s["num_steps"], "kv_events": kv.get("events", 0), "rate_scale": rate_scale,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", nargs="+", default=["dynamo", "llm_d:precise"])
    ap.add_argument("--case", choices=sorted(CASES), default="fleet", help="the setting (see the docstring)")
    ap.add_argument("--replicas", type=int, default=None, help="default: the case's (16, 1000, 256)")
    ap.add_argument("--limit", type=int, default=None, help="first N requests only (default: the case's)")
    ap.add_argument("--no-single", action="store_true", help="skip the single-engine reference run")
    ap.add_argument("--out", default=None, help="also keep the figures as this results folder (replaced whole)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every setting, alternating")
    ap.add_argument("--tree", default=None, help="also time this checkout's packages, alternating")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rate-scale", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    replicas, limit, rate_scale, _ = CASES[args.case]
    args.replicas = args.replicas if args.replicas is not None else replicas
    args.limit = args.limit if args.limit is not None else limit
    args.rate_scale = args.rate_scale if args.rate_scale is not None else rate_scale
    if args.child is not None:
        print(json.dumps(_one(args.child, args.replicas, args.limit, args.rate_scale)))
        return
    run_with_folder(args.out, ("rows.json", "table.md").__contains__, lambda f: _bench(args, f))


def _bench(args: argparse.Namespace, folder: BenchFolder | None) -> None:
    trees = bench_trees(args.tree)
    runs = ([] if args.no_single or args.case == "idle" else ["single"]) + args.routers
    rows = []
    for rep in range(args.repeat):
        for label, root in trees:
            for r in runs:
                cmd = [sys.executable, __file__, "--child", r, "--replicas", str(args.replicas), "--case", args.case,
                       "--rate-scale", str(args.rate_scale)]
                if args.limit:
                    cmd += ["--limit", str(args.limit)]
                rows.append({"tree": label, "run": rep, **child_json(cmd, root)})
                print(json.dumps(rows[-1]), flush=True)
    single = {label: statistics.median(r["cpu_s"] for r in rows if r["tree"] == label and r["router"] == "single")
              for label, _ in trees if "single" in runs}
    for r in rows:
        r["cpu_over_single"] = round(r["cpu_s"] / single[r["tree"]], 2) if r["tree"] in single else None
    keys = ["tree", "run", "router", "replicas", "wall_s", "cpu_s", "sim_s_per_wall_s", "peak_rss_mib",
            "token_hit_rate", "ttft_p50_s", "steps", "kv_events", "cpu_over_single"]
    table = markdown_table(keys, rows)
    table += "\n" + _verdicts(args, trees, runs, rows, single)
    print("\n" + table, end="")
    if folder is not None:
        meta = {"benchmark": "bench_cluster", "case": args.case, "routers": args.routers, "replicas": args.replicas,
                "limit": args.limit, "rate_scale": args.rate_scale, "single": runs[0] == "single",
                "repeat": args.repeat, "tree": args.tree}
        print(f"results folder: {folder.write({'rows.json': rows, 'table.md': table}, meta)}")


def _verdicts(args: argparse.Namespace, trees: list[tuple[str, Path]], runs: list[str], rows: list[dict],
              single: dict[str, float]) -> str:
    """One line per tree and router: its medians, and the case's targets met or missed."""
    lines = []
    targets = CASES[args.case][3]
    for label, _ in trees:
        for router in runs:
            mine = [r for r in rows if r["tree"] == label and r["router"] == router]
            cpu = statistics.median(r["cpu_s"] for r in mine)
            wall = statistics.median(r["wall_s"] for r in mine)
            rss = max(r["peak_rss_mib"] for r in mine)
            line = (f"{label}: {router}, {mine[0]['replicas']} replicas: median {cpu:.2f} s CPU, {wall:.1f} s wall, "
                    f"peak RSS {rss} MiB over {len(mine)} run(s)")
            if router != "single":
                if label in single:
                    ratio = cpu / single[label]
                    line += f"; {ratio:.2f}x the single engine's {single[label]:.2f} s"
                    if args.case == "ratio":
                        line += f" (target under 2x: {'met' if ratio < 2.0 else 'missed'})"
                if args.case == "fleet" and args.limit is None:
                    line += f" (target under 15 s of CPU: {'met' if cpu < 15.0 else 'missed'})"
                if targets is not None:
                    wall_t, rss_t = targets
                    ok = wall < wall_t and rss < rss_t
                    line += f" (target under {wall_t:g} s and {rss_t:.0f} MiB: {'met' if ok else 'missed'})"
            lines.append(line + "\n")
    return "".join(lines)


if __name__ == "__main__":
    main()
