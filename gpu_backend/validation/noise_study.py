"""Where the CPU backend's timing noise comes from, and what reduces it.

Mirrors nothing in vLLM. Three measurements, written to one results folder with the host's state
(load average, steal time, CPU frequency control) and the config, git commit and package versions:

1. **step noise** -- a fixed set of step shapes (decode, prefill, mixed) timed under each setting:
   wall clock vs the thread's CPU time (``thread_cpu``), 1 vs 2 torch threads, unpinned vs pinned to
   one CPU (``os.sched_setaffinity``, what ``taskset`` does), and the median of 1, 3 or 5
   back-to-back runs; each round runs every shape 5 times back to back, in a seeded shuffled order,
   so the first run of a group shows the cold-start (warm-up) penalty;
2. **amplification** -- simulated replays of the validation workloads whose step durations are
   multiplied by seeded lognormal noise of a given spread, against the noiseless replay: how much
   per-request TTFT/E2E error a given per-step noise produces (deterministic, no torch timing);
3. **real vs real** -- two real replays of a validation workload per timing setting, their
   per-request TTFT/E2E MAPE (the validation's noise floor under that setting).

Invariants: every figure is computed from the raw times kept in the output (``noise.json``); the
process's CPU affinity and torch thread count are restored after each setting. Imports torch.

    python -m gpu_backend.validation.noise_study --out results/reference/cpu_tiny/noise [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_backend.calibration.calibrate import CalibrationSetup, build_executor
from gpu_backend.calibration.grid_timing import _inputs
from gpu_backend.calibration.host import load_average
from gpu_backend.calibration.profiling_grid import GridPoint, pool_blocks
from gpu_backend.validation.latency_error import compare
from sim.core.executor import StepShape
from sim.timing.latency import LatencyModel

SHAPES: dict[str, GridPoint] = {
    "decode 4 x 128": GridPoint("decode", ((128, 1),) * 4),
    "decode 12 x 384": GridPoint("decode", ((384, 1),) * 12),
    "prefill 48 @ 64": GridPoint("prefill", ((64, 48),)),
    "prefill 192 @ 0": GridPoint("prefill", ((0, 192),)),
    "mixed 64 @ 160 + 6 x 300": GridPoint("mixed", ((160, 64),) + ((300, 1),) * 6),
}


@dataclass(frozen=True)
class Setting:
    name: str
    timing: str  # wall | thread_cpu
    threads: int
    pinned: bool


SETTINGS = (
    Setting("wall, 2 threads", "wall", 2, False),
    Setting("wall, 1 thread", "wall", 1, False),
    Setting("wall, 1 thread, pinned", "wall", 1, True),
    Setting("thread_cpu, 1 thread", "thread_cpu", 1, False),
    Setting("thread_cpu, 1 thread, pinned", "thread_cpu", 1, True),
)
GROUP = 5  # back-to-back runs of a shape per round


def host_state() -> dict[str, Any]:
    """Load average, cumulative steal / total CPU jiffies, and whether CPU frequency is visible."""
    out: dict[str, Any] = {"load_average": load_average(), "cpus": os.cpu_count(),
                           "cpufreq_visible": Path("/sys/devices/system/cpu/cpu0/cpufreq").exists()}
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        vals = [int(x) for x in fields]
        out["jiffies_total"] = sum(vals[:8])
        out["jiffies_steal"] = vals[7] if len(vals) > 7 else 0
    except (OSError, ValueError):  # pragma: no cover - not Linux
        pass
    return out


def _spread(times: Sequence[float]) -> dict[str, float]:
    a = np.asarray(times)
    return {"n": int(a.size), "median_ms": float(np.median(a) * 1e3), "cv": float(a.std() / a.mean()),
            "p90_over_median": float(np.percentile(a, 90) / np.median(a))}


def step_noise(settings: Sequence[Setting], rounds: int, log: Callable[[str], object]) -> list[dict[str, Any]]:
    """Time every shape under every setting; per setting and shape: the raw groups and their spread
    for medians of 1 (the group's first run), 3 and 5 runs, and the first-run penalty."""
    rows = []
    blocks = pool_blocks(list(SHAPES.values()), 16)
    old_threads, old_aff = torch.get_num_threads(), os.sched_getaffinity(0)
    try:
        for st in settings:
            torch.set_num_threads(st.threads)
            if st.pinned:
                os.sched_setaffinity(0, {max(old_aff)})
            ex, _ = build_executor(CalibrationSetup(num_threads=st.threads, timing=st.timing), blocks)  # type: ignore[arg-type]
            rng = np.random.default_rng(0)
            inputs = {k: _inputs(g, blocks, 16, ex.model.vocab_size, rng) for k, g in SHAPES.items()}
            names = list(SHAPES)
            groups: dict[str, list[list[float]]] = {k: [] for k in names}
            h0 = host_state()
            for r in range(rounds + 1):
                rng.shuffle(names)
                for k in names:
                    g = [ex.run_timed(inputs[k])[0] for _ in range(GROUP)]
                    if r:  # round 0 warms up
                        groups[k].append(g)
            h1 = host_state()
            steal = _steal_share(h0, h1)
            for k in SHAPES:
                gs = groups[k]
                rows.append({
                    "setting": st.name, "timing": st.timing, "threads": st.threads, "pinned": st.pinned, "shape": k,
                    "median_of_1": _spread([g[0] for g in gs]),
                    "median_of_3": _spread([statistics.median(g[:3]) for g in gs]),
                    "median_of_5": _spread([statistics.median(g) for g in gs]),
                    "first_run_penalty": float(np.median([g[0] / statistics.median(g[1:]) for g in gs])),
                    "raw_s": gs, "steal_share": steal, "load_average": h1["load_average"]})
            log(f"   {st.name}: " + ", ".join(f"{r['shape']} cv {r['median_of_1']['cv']:.1%}"
                                               for r in rows[-len(SHAPES):]) + f"; steal {steal:.1%}")
            del ex
            os.sched_setaffinity(0, old_aff)
    finally:
        torch.set_num_threads(old_threads)
        os.sched_setaffinity(0, old_aff)
    return rows


def _steal_share(h0: dict[str, Any], h1: dict[str, Any]) -> float:
    total = h1.get("jiffies_total", 0) - h0.get("jiffies_total", 0)
    return float((h1.get("jiffies_steal", 0) - h0.get("jiffies_steal", 0)) / total) if total > 0 else float("nan")


class NoisyLatency(LatencyModel):
    """``base``'s step time times seeded lognormal noise of spread ``sigma`` (a test instrument)."""

    name = "noisy"

    def __init__(self, base: LatencyModel, sigma: float, seed: int) -> None:
        self.base, self.sigma = base, sigma
        self.rng = np.random.default_rng(seed)

    def step_time(self, shape: StepShape) -> float:
        return self.base.step_time(shape) * float(np.exp(self.sigma * self.rng.standard_normal()))


def amplification(configs: Sequence[str | Path], sigmas: Sequence[float], seeds: int,
                  log: Callable[[str], object]) -> list[dict[str, Any]]:
    """Per config and per-step noise spread: per-request TTFT/E2E MAPE of noisy simulated replays
    against the noiseless one (mean over ``seeds`` noise draws)."""
    from sim.experiment.config import load_config
    from sim.experiment.run import build_latency, replay_experiment
    from sim.timing.simulated_executor import SimulatedExecutor

    rows = []
    for path in configs:
        cfg = load_config(path, ["replay.fast_forward=false"])
        base = build_latency(cfg)
        ref, _ = replay_experiment(cfg, progress=False)
        r0 = ref.requests.set_index("request_id")
        for sigma in sigmas:
            ttft, e2e = [], []
            for seed in range(seeds):
                noisy = NoisyLatency(base, sigma, seed)
                res, _ = replay_experiment(cfg, progress=False, executor_factory=lambda c, s: SimulatedExecutor(noisy))
                r = res.requests.set_index("request_id").reindex(r0.index)
                ttft.append(compare(r["ttft"], r0["ttft"])["mape"])
                e2e.append(compare(r["e2e"], r0["e2e"])["mape"])
            rows.append({"config": cfg.name, "step_sigma": sigma, "ttft_mape": float(np.mean(ttft)),
                         "e2e_mape": float(np.mean(e2e)), "seeds": seeds})
            log(f"   {cfg.name}: per-step noise {sigma:.0%} -> TTFT MAPE {rows[-1]['ttft_mape']:.1%}, "
                f"E2E MAPE {rows[-1]['e2e_mape']:.1%}")
    return rows


REAL_SETTINGS = (("wall, 1 run", "wall", 1), ("thread_cpu, 1 run", "thread_cpu", 1),
                 ("thread_cpu, median of 3", "thread_cpu", 3))


def real_vs_real(config: str | Path, log: Callable[[str], object], limit: int | None = None) -> list[dict[str, Any]]:
    """Two real replays of ``config`` per timing setting; their per-request TTFT/E2E error."""
    from gpu_backend.executor.real_run import real_run
    from sim.experiment.config import load_config

    rows = []
    for label, timing, repeats in REAL_SETTINGS:
        sets = [f"backend.timing={timing}", f"backend.timing_repeats={repeats}", "backend.num_threads=1"]
        if limit:
            sets.append(f"workload.limit={limit}")
        cfg = load_config(config, sets)
        runs = [real_run(cfg, None) for _ in range(2)]
        a, b = (r.requests.set_index("request_id") for r in runs)
        b = b.reindex(a.index)
        ttft, e2e = compare(b["ttft"], a["ttft"]), compare(b["e2e"], a["e2e"])
        rows.append({"config": cfg.name, "setting": label, "ttft": ttft, "e2e": e2e,
                     "wall_s": [round(r.wall_s, 1) for r in runs], "steps": [len(r.step_shapes) for r in runs],
                     "load_average": load_average()})
        log(f"   {cfg.name} {label}: real-vs-real TTFT MAPE {ttft['mape']:.1%}, E2E MAPE {e2e['mape']:.1%}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from gpu_backend.validation.noise_report import write_report

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="few rounds, one amplification seed (tests)")
    ap.add_argument("--configs", nargs="+", default=["configs/validate_chat_cpu.yaml", "configs/validate_rag_cpu.yaml"])
    ap.add_argument("--skip-real", action="store_true", help="leave out the real-vs-real replays")
    a = ap.parse_args(argv)
    from sim.experiment.results import git_commit

    t0 = time.perf_counter()
    commit = git_commit(Path(__file__).resolve().parent)  # the code that runs, before anything is written
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = print
    log("== step noise")
    steps = step_noise(SETTINGS[:2] + SETTINGS[3:4] if a.quick else SETTINGS, 2 if a.quick else 12, log)
    log("== amplification of per-step noise into per-request error (simulated)")
    amp = amplification(a.configs, (0.01, 0.03, 0.1) if a.quick else (0.01, 0.03, 0.05, 0.1, 0.2), 1 if a.quick else 3,
                        log)
    real = []
    if not a.skip_real:
        log("== real vs real")
        real = real_vs_real(a.configs[0], log, limit=8 if a.quick else None)
    write_report(out, {"step_noise": steps, "amplification": amp, "real_vs_real": real, "host": host_state(),
                       "args": vars(a), "wall_s": round(time.perf_counter() - t0, 1), "git_commit": commit})
    log(f"wrote {out}/noise.json and noise.md")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
