"""Benchmark: instructions executed by the Mooncake replay, this checkout against another tree (A/B).

CPU seconds on a shared VM drift by 10-30 % within minutes, more than a change of a few percent.
The number of instructions a replay executes does not: valgrind's ``callgrind`` counts them
(``Ir``), and two runs of the same code differ by about 0.1 %. This script counts them for
``bench_mooncake.py --child B --limit N`` (the replay of the first N Mooncake requests at block
size B, in a fresh process) in each tree. It subtracts the count of the same command with
``--limit 1`` (imports, pool and workload set-up), which leaves the replay's own instructions, and
prints the ratio. The two trees run side by side, one process each, since the counts do not depend
on timing. Every run also reports the replay's steps and hit rate, and those must be equal.

    python benchmarks/bench_instructions.py --base-tree /path/to/worktree [--block-sizes 512 16]
        [--limit 1500] [--out results/benchmarks/instructions_ab]

``--base-tree`` is a checkout of the commit to compare against, for example
``git worktree add /tmp/base <commit>``, with its compiled modules copied in. Needs ``valgrind``
(``apt-get install valgrind``); it says so and stops if that is missing. Instruction counts are
not time: cache misses and branch mispredictions are left out. They measure the interpreter work
that Python-level changes remove. ``--out`` keeps the figures as a results folder
(``bench_results``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_results import ROOT, BenchFolder, compile_bytecode, run_with_folder

_COLLECTED = re.compile(r"Collected : (\d+)")


def count(tree: Path, block_size: int, limit: int) -> dict:
    """callgrind's instruction count of one child run in ``tree``, and the run's own figures."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(tree))
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
               str(tree / "benchmarks" / "bench_mooncake.py"), "--child", str(block_size), "--limit", str(limit)]
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    m = _COLLECTED.search(res.stderr)
    if m is None:
        raise SystemExit(f"no instruction count in callgrind's output for {tree}:\n{res.stderr[-2000:]}")
    row = json.loads(res.stdout.strip().splitlines()[-1])
    return {"instructions": int(m.group(1)), "steps": row["steps"], "token_hit_rate": row["token_hit_rate"],
            "requests": row["requests"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-tree", required=True, help="checkout of the commit to compare against")
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[512, 16])
    ap.add_argument("--limit", type=int, default=1500, help="first N Mooncake requests")
    ap.add_argument("--out", default=None, help="also keep the figures as this results folder (replaced whole)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench_instructions: valgrind is not installed (apt-get install valgrind)")
    base = Path(args.base_tree).resolve()
    if not (base / "benchmarks" / "bench_mooncake.py").is_file():
        raise SystemExit(f"--base-tree {base}: no benchmarks/bench_mooncake.py there")
    run_with_folder(args.out, ("rows.json", "table.md").__contains__, lambda f: _bench(args, base, f))


def _commit(tree: Path) -> str | None:
    res = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return res.stdout.strip() or None


def _bench(args: argparse.Namespace, base: Path, folder: BenchFolder | None) -> None:
    compile_bytecode()  # both trees: an interpreter that writes no bytecode would count compiling them
    compile_bytecode(base)
    rows = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for bs in args.block_sizes:
            jobs = {(name, lim): pool.submit(count, tree, bs, lim)
                    for name, tree in (("base", base), ("head", ROOT)) for lim in (args.limit, 1)}
            got = {k: f.result() for k, f in jobs.items()}
            b, h = got[("base", args.limit)], got[("head", args.limit)]
            if (b["steps"], b["token_hit_rate"]) != (h["steps"], h["token_hit_rate"]):
                raise SystemExit(f"block {bs}: the trees replay differently: base {b}, head {h}")
            rb = b["instructions"] - got[("base", 1)]["instructions"]
            rh = h["instructions"] - got[("head", 1)]["instructions"]
            row = {"block_size": bs, "requests": h["requests"], "steps": h["steps"],
                   "base_total": b["instructions"], "head_total": h["instructions"],
                   "base_startup": got[("base", 1)]["instructions"], "head_startup": got[("head", 1)]["instructions"],
                   "base_replay": rb, "head_replay": rh, "replay_ratio": round(rh / rb, 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = ["block_size", "requests", "steps", "base_replay", "head_replay", "replay_ratio"]
    table = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    table += "".join("| " + " | ".join(f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys)
                     + " |\n" for r in rows)
    print("\n" + table, end="")
    if folder is not None:
        meta = {"benchmark": "bench_instructions", "block_sizes": args.block_sizes, "limit": args.limit,
                "base_tree_commit": _commit(base), "counter": "valgrind callgrind Ir, PYTHONHASHSEED=0"}
        print(f"results folder: {folder.write({'rows.json': rows, 'table.md': table}, meta)}")


if __name__ == "__main__":
    main()
