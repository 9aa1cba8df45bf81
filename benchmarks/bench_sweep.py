"""Benchmark: the 48-point chat sweep on the Mooncake trace (configs/sweeps/mooncake_chat.yaml).

Block size {16, 64, 256, 512} x KV pool {16, 24, 32, 48} GiB x salt policy {none, per_tenant,
per_request}, each point a full replay plus its offline bounds (infinite cache, Belady, sequential
LRU). Runs the sweep from scratch into a temporary folder through the local process pool and prints
the wall time, the time per point, and per worker process its points, busy time and peak RSS; then
the hit rates at salt policy ``none``.

    python benchmarks/bench_sweep.py [--limit 2000 | --limit 0 (whole trace)] [--workers N] [--keep DIR]

``--limit`` keeps the first N requests of the trace (default 2,000 of 12,031: the whole trace
x 48 points takes far longer on a small machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default=str(ROOT / "configs" / "sweeps" / "mooncake_chat.yaml"))
    ap.add_argument("--limit", type=int, default=2000, help="first N trace requests (0: the whole trace)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    ap.add_argument("--keep", default=None, help="write the sweep folder here (default: a temp dir, removed)")
    ap.add_argument("--no-bounds", action="store_true", help="skip the offline bounds")
    args = ap.parse_args()

    from sim.experiment.sweep import run_sweep
    from sim.experiment.sweep_config import load_sweep

    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    overrides = [f"workload.limit={args.limit if args.limit > 0 else 'null'}"]
    sweep = load_sweep(args.sweep, str(out), overrides)
    if args.no_bounds:
        sweep.bounds = False
    workers = args.workers or os.cpu_count() or 1
    print(f"{sweep.name}: {len(sweep.points)} points, trace limit {args.limit or 'none (whole trace)'}, "
          f"{workers} worker(s), cpu_count {os.cpu_count()}")
    t0 = time.perf_counter()
    rep = run_sweep(sweep, workers=workers, resume=False, progress=True)
    wall = time.perf_counter() - t0
    df = rep.table
    ok = df[df["status"] == "ok"]
    print(f"\nwall time {wall:.1f} s for {len(df)} points ({len(ok)} ok, {len(rep.errors)} failed): "
          f"{len(df) / wall * 60:.1f} points/min")
    busy = ok["wall_time_s"] + ok["bounds_wall_time_s"]
    print(f"per point: replay median {ok['wall_time_s'].median():.2f} s (min {ok['wall_time_s'].min():.2f}, "
          f"max {ok['wall_time_s'].max():.2f}); bounds median {ok['bounds_wall_time_s'].median():.2f} s; "
          f"requests {int(ok['num_requests'].iloc[0]):,}, prompt tokens {int(ok['prompt_tokens'].iloc[0]):,}")
    print("\nper worker process:")
    print(f"  {'worker':<28} {'points':>6} {'busy s':>8} {'peak RSS MiB':>13}")
    for worker, g in ok.assign(busy=busy).groupby("worker"):
        print(f"  {worker:<28} {len(g):>6} {g['busy'].sum():>8.1f} {g['worker_peak_rss_mib'].max():>13.1f}")
    print(f"driver peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    none = ok[ok["salt_policy"] == "none"]
    if not none.empty:
        print("\ntoken_hit_rate (vLLM's definition), salt none: rows block size, columns KV pool GiB")
        print(none.pivot_table(index="block_size", columns="kv_pool_gib", values="token_hit_rate").round(3).to_string())
        print("\nBelady (request-level, same capacity); infinite-cache bound per block size:")
        belady = none.pivot_table(index="block_size", columns="kv_pool_gib", values="belady_hit_rate")
        print(belady.round(3).to_string())
        print(none.groupby("block_size")["infinite_cache_hit_rate"].first().round(3).to_string())
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    else:
        print(f"\nsweep folder: {rep.folder}")


if __name__ == "__main__":
    main()
