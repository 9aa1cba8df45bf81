"""What a step's cost depends on beyond its shape: two probes on the CPU backend.

Mirrors nothing in vLLM. The latency model prices a step by its :class:`~sim.core.executor.StepShape`
alone; on a CPU two things the shape does not carry change the cost of the very same step:

1. **block layout** -- a one-sequence decode at a fixed context whose KV blocks are contiguous in
   the pool, spaced by a stride, or scattered at random (the hardware prefetcher follows
   contiguous reads; the pool's free queue decides which blocks a replay gets);
2. **history** -- the same decode timed once, and as the median of 3 back-to-back runs, right after
   a few small steps (decodes of the same shape) or after large ones (prefills and a wide decode
   that evict the caches).

Each probe interleaves its variants in seeded shuffled rounds on one executor (thread CPU time, one
torch thread), so the host's drift hits all alike. Output: ``probe.json`` (every raw time, the
host's load average before and after, git commit, package versions) and ``probe.md``.

Invariants: every figure of ``probe.md`` is computed from the raw times in ``probe.json``; block
tables never hold the null block; the probed step is the same object in every variant of a probe.
Imports torch.

    python -m gpu_backend.calibration.step_cost_probe --out results/reference/cpu_tiny/step_cost
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_backend.calibration.calibrate import build_executor
from gpu_backend.calibration.calibration_setup import CalibrationSetup
from gpu_backend.calibration.host import load_average
from gpu_backend.layout.batch import SeqInput

POOL = 240
CTX = 300  # the probed decode: one sequence at 300 cached tokens (19 blocks + the new token's)


def _decode(rng: np.random.Generator, blocks: list[int], ctx: int = CTX) -> list[SeqInput]:
    return [SeqInput("d", rng.integers(0, 1000, 1), ctx, blocks)]


def layouts(rng: np.random.Generator) -> dict[str, list[int]]:
    need = -(-(CTX + 1) // 16)
    out = {f"stride {s}": list(range(1, 1 + s * need, s)) for s in (1, 2, 4, 8, 11)}
    out["random"] = rng.choice(np.arange(1, POOL), need, replace=False).tolist()
    return {k: v for k, v in out.items() if max(v) < POOL}


def probe_layout(rounds: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    ex, _ = build_executor(CalibrationSetup(timing="thread_cpu", timing_repeats=3), POOL)
    steps = {k: _decode(rng, v) for k, v in layouts(rng).items()}
    for s in steps.values():
        ex.time_step(s)
    res: dict[str, list[float]] = {k: [] for k in steps}
    keys = list(steps)
    for _ in range(rounds):
        for i in rng.permutation(len(keys)):
            res[keys[i]].append(ex.time_step(steps[keys[i]]))
    return res


def probe_history(rounds: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    ids = (rng.permutation(POOL - 1) + 1).tolist()
    need = -(-(CTX + 1) // 16)
    probe = _decode(rng, ids[:need])
    small = [_decode(rng, ids[40:40 + need]) for _ in range(5)]
    large = [[SeqInput("p", rng.integers(0, 1000, 200), 500, ids[100:146])] for _ in range(2)]
    large.append([SeqInput(f"w{i}", rng.integers(0, 1000, 1), 600, ids[i * 38:(i + 1) * 38]) for i in range(6)])
    res: dict[str, list[float]] = {}
    for repeats in (1, 3):
        ex, _ = build_executor(CalibrationSetup(timing="thread_cpu", timing_repeats=repeats), POOL)
        for before in ("small", "large"):
            res[f"{repeats} run(s), after {before} steps"] = []
        for _ in range(rounds):
            for before in rng.permutation(["small", "large"]):
                for s in small if before == "small" else large:
                    ex.run_timed(s)
                res[f"{repeats} run(s), after {before} steps"].append(ex.time_step(probe))
    return res


def _summary(res: dict[str, list[float]], base: str) -> list[dict[str, Any]]:
    ref = float(np.median(res[base]))
    return [{"variant": k, "n": len(v), "median_ms": 1e3 * float(np.median(v)),
             "vs_first": float(np.median(v)) / ref} for k, v in res.items()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from sim.experiment.results import git_commit, package_versions

    torch.set_num_threads(1)
    t0, load0 = time.perf_counter(), load_average()
    layout = probe_layout(a.rounds, a.seed)
    history = probe_history(a.rounds, a.seed)
    rep: dict[str, Any] = {"args": vars(a), "load_average_before": load0, "load_average_after": load_average(),
           "wall_s": round(time.perf_counter() - t0, 1), "git_commit": git_commit(Path(__file__).resolve().parent),
           "versions": package_versions(), "torch_threads": torch.get_num_threads(), "timing": "thread_cpu",
           "layout": {"raw_s": layout, "summary": _summary(layout, "stride 1")},
           "history": {"raw_s": history, "summary": _summary(history, "1 run(s), after small steps")}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(rep, indent=1) + "\n")
    lines = ["# Step cost beyond the shape", "",
             f"One-sequence decode at context {CTX}, thread CPU time, one torch thread, {a.rounds} shuffled rounds; "
             f"load average {load0} before, {rep['load_average_after']} after; commit {rep['git_commit']}.", ""]
    for name, title in (("layout", "KV block layout (median of 3 runs per sample)"),
                        ("history", "what ran just before (1 run, or the median of 3 back-to-back runs)")):
        lines += [f"## {title}", "", "| variant | samples | median | vs first row |", "|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['n']} | {r['median_ms']:.3f} ms | {r['vs_first']:.3f} |"
                  for r in rep[name]["summary"]]
        lines.append("")
    (out / "probe.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
