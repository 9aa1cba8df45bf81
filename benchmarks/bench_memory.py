"""Benchmark: what a fleet's replicas cost in memory -- idle, after one request, and at scale.

Issue 38 item 1: a replica's pool grows with the blocks it touches, not with ``num_gpu_blocks``.
Every run is a fresh process (its peak RSS is its own), the replay timed as in
``benchmarks/bench_cluster.py`` (whose ``_one`` runs the fleet cases); Mooncake conversation trace,
block 16, the pool vLLM would allocate for Llama-3-8B on an H100 (28,889 blocks) unless a case
sets ``engine.num_gpu_blocks``.

    python benchmarks/bench_memory.py [--cases engine used idle scale] [--tree DIR] [--repeat N] [--out DIR]

Cases, each printing its figure (and target) per tree:

* ``engine``: one engine serving the first request, with 10,000 and with 1,000,000 blocks: the
  peak RSS difference is what a used engine allocates per ``num_gpu_blocks`` (reported per
  million blocks);
* ``used``: 1,000 replicas behind round robin serving the first 60 and the first 240 requests
  (each request on its own replica): the RSS difference over the 180 more replicas built is the
  cost of a replica that served one request (its request and its rows included);
* ``idle``: 1,000 and 5,000 replicas serving the first 60 requests: the RSS difference over the
  4,000 more idle replicas is an idle replica's cost (target under 64 KiB); the 1,000-replica run
  is also issue 38's idle case (target under 500 MB and 5 s of wall time);
* ``scale``: 256 replicas behind Dynamo on the trace sped up 16x (target under 4 GB peak RSS and
  120 s; CPU seconds beside wall, the host being shared).

``--tree DIR`` also runs every setting on another checkout's packages (``PYTHONPATH``), alternating
with this one (rows tagged ``tree``); ``--out DIR`` keeps ``rows.json``, ``table.md`` and
``meta.json`` as a results folder (``bench_results.BenchFolder``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench_results import BenchFolder, bench_trees, child_json, markdown_table, run_with_folder

MIB = 1 << 20
SETTINGS = {  # case -> (label, router, replicas, limit, rate scale, num_gpu_blocks or None)
    "engine": [("engine_10k", "single", 1, 1, 1.0, 10_000), ("engine_1m", "single", 1, 1, 1.0, 1_000_000)],
    "used": [("rr_1000x60", "round_robin", 1000, 60, 1.0, None), ("rr_1000x240", "round_robin", 1000, 240, 1.0, None)],
    "idle": [("rr_1000x60", "round_robin", 1000, 60, 1.0, None), ("rr_5000x60", "round_robin", 5000, 60, 1.0, None)],
    "scale": [("dynamo_256_x16", "dynamo", 256, None, 16.0, None)],
}


def _one(router: str, replicas: int, limit: int | None, rate_scale: float, blocks: int | None) -> dict:
    """One replay in this process: wall and CPU seconds, peak RSS, what it simulated."""
    from sim.experiment.config import config_from_dict
    from sim.experiment.run import replay_experiment

    engine: dict = {"block_size": 16} | ({"num_gpu_blocks": blocks} if blocks is not None else {})
    data: dict = {"name": "bench", "engine": engine, "workload": {"kind": "mooncake", "limit": limit}}
    if rate_scale != 1.0:
        data["workload"]["arrival"] = {"kind": "trace", "rate_scale": rate_scale}
    if router != "single":
        data["cluster"] = {"replicas": replicas, "router": {"kind": router}}
    cfg = config_from_dict(data)
    t0, c0 = time.perf_counter(), time.process_time()
    res, _ = replay_experiment(cfg, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary
    return {
        "router": router, "replicas": replicas, "requests": s["num_requests"], "num_gpu_blocks": blocks,
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "token_hit_rate": round(s["token_hit_rate"], 4), "steps": s["num_steps"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", choices=sorted(SETTINGS), default=["engine", "used", "idle", "scale"])
    ap.add_argument("--repeat", type=int, default=1, help="runs of every setting, alternating trees")
    ap.add_argument("--tree", default=None, help="also run this checkout's packages, alternating")
    ap.add_argument("--out", default=None, help="also keep the figures as this results folder (replaced whole)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        router, replicas, limit, rate, blocks = json.loads(args.child)
        print(json.dumps(_one(router, replicas, limit, rate, blocks)))
        return
    run_with_folder(args.out, ("rows.json", "table.md").__contains__, lambda f: _bench(args, f))


def _bench(args: argparse.Namespace, folder: BenchFolder | None) -> None:
    trees = bench_trees(args.tree)
    settings = {s[0]: s for case in args.cases for s in SETTINGS[case]}  # (idle and used share a run)
    rows = []
    for rep in range(args.repeat):
        for label, (_, router, replicas, limit, rate, blocks) in settings.items():
            for tree, root in trees:
                cmd = [sys.executable, __file__, "--child", json.dumps([router, replicas, limit, rate, blocks])]
                rows.append({"tree": tree, "run": rep, "setting": label, **child_json(cmd, root)})
                print(json.dumps(rows[-1]), flush=True)
    keys = ["tree", "run", "setting", "router", "replicas", "requests", "num_gpu_blocks", "wall_s", "cpu_s",
            "peak_rss_mib", "token_hit_rate", "steps"]
    table = markdown_table(keys, rows)
    table += "\n" + "".join(_verdicts(args.cases, [t for t, _ in trees], rows))
    print("\n" + table, end="")
    if folder is not None:
        meta = {"benchmark": "bench_memory", "cases": args.cases, "repeat": args.repeat,
                "tree": str(Path(args.tree).resolve()) if args.tree else None,
                "tree_commit": _commit(Path(args.tree)) if args.tree else None}
        print(f"results folder: {folder.write({'rows.json': rows, 'table.md': table}, meta)}")


def _commit(root: Path) -> str | None:
    """The commit checked out in ``root`` (None when git cannot say)."""
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def _verdicts(cases: list[str], trees: list[str], rows: list[dict]) -> list[str]:
    """One line per tree and case: the derived figure and its target met or missed (least RSS of
    the repeats: the host's other processes can only add to a run's figure through swapping, never
    take from it; the least CPU likewise)."""
    lines = []
    for tree in trees:
        def best(setting: str, key: str = "peak_rss_mib") -> float:
            return min(r[key] for r in rows if r["tree"] == tree and r["setting"] == setting)

        if "engine" in cases:
            per = (best("engine_1m") - best("engine_10k")) / 0.99  # MiB per million blocks
            lines.append(f"{tree}: a used engine's peak RSS grows by {per:,.1f} MiB per million num_gpu_blocks "
                         f"({per * MIB / 1e6:,.1f} bytes per block)\n")
        if "used" in cases:
            per = (best("rr_1000x240") - best("rr_1000x60")) * 1024 / 180
            lines.append(f"{tree}: a replica that served one request costs {per:,.0f} KiB "
                         "(its request included; 180 more used replicas of 1,000)\n")
        if "idle" in cases:
            per = (best("rr_5000x60") - best("rr_1000x60")) * 1024 / 4000
            rss, wall = best("rr_1000x60"), best("rr_1000x60", "wall_s")
            lines.append(f"{tree}: an idle replica costs {per:,.1f} KiB (target under 64 KiB: "
                         f"{'met' if per < 64 else 'missed'}); 1,000 replicas serving 60 requests: {rss:,.1f} MiB, "
                         f"{wall:.1f} s wall (target under 477 MiB and 5 s: "
                         f"{'met' if rss < 500e6 / MIB and wall < 5 else 'missed'})\n")
        if "scale" in cases:
            rss, wall, cpu = (best("dynamo_256_x16", k) for k in ("peak_rss_mib", "wall_s", "cpu_s"))
            lines.append(f"{tree}: 256 replicas at 16x: {rss:,.1f} MiB peak RSS (target under {4e9 / MIB:,.0f} MiB: "
                         f"{'met' if rss < 4e9 / MIB else 'missed'}), {cpu:.1f} s CPU, {wall:.1f} s wall "
                         f"(target under 120 s: {'met' if wall < 120 else 'missed'})\n")
    return lines


if __name__ == "__main__":
    main()
