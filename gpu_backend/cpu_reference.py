"""The committed CPU reference (``results/reference/cpu_tiny/``): calibration and validation measured
in one time window, interleaved.

Mirrors nothing in vLLM. On a CPU shared with other processes the machine's speed drifts by tens
of percent within minutes; a model calibrated at one moment and validated at another inherits
that drift as bias. Here the real replays of the calibration workloads and of the held-out
validation workloads alternate, round by round (``calibrate_chat``, ``calibrate_rag``,
``validate_chat``, ``validate_rag``, then again), so a slow spell hits both alike; only then is
the model fitted -- on the calibration replays and the isolated grid, never on a validation
step -- and each validation report built from its first two real runs. The steps of real run 1
are re-timed in every round (:func:`gpu_backend.real_run.retime`), so the per-step error is taken
against medians that span the same window as the calibration. The commands ``apcsim calibrate`` and ``apcsim
validate`` do the same steps one after the other.

Invariants: the validation workloads never enter the fit; every input and setting is in the
output (model file metadata, report.json: config, git commit, package versions). Imports torch.

    python -m gpu_backend.cpu_reference --out results/reference/cpu_tiny
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpu_backend.calibrate import calibrate, setup_from_config, write_outputs
from gpu_backend.profiling_grid import PRESETS
from gpu_backend.real_run import RealRun, real_run, retime
from gpu_backend.replay_samples import backend_overrides
from gpu_backend.validate import validate, with_fitted_latency
from gpu_backend.validation_report import validation_table
from sim.experiment.config import load_config

CALIBRATION = ("configs/calibrate_chat_cpu.yaml", "configs/calibrate_rag_cpu.yaml")
VALIDATION = {"validate_chat": "configs/validate_chat_cpu.yaml", "validate_rag": "configs/validate_rag_cpu.yaml"}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each: every workload once)")
    ap.add_argument("--retime-passes", type=int, default=2,
                    help="re-timing passes of validation real run 1 in each round")
    ap.add_argument("--grid", default="cpu", choices=tuple(PRESETS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every workload config")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    setup, _ = setup_from_config(VALIDATION["validate_chat"])
    sets = [*backend_overrides(setup), *a.set]
    cal_cfgs = [load_config(p, sets) for p in CALIBRATION]
    val_cfgs = {k: load_config(p, sets) for k, p in VALIDATION.items()}
    cal_runs: list[tuple[str, RealRun]] = []
    val_runs: dict[str, list[RealRun]] = {k: [] for k in val_cfgs}
    retimed: dict[str, list[np.ndarray]] = {k: [] for k in val_cfgs}
    for r in range(a.rounds):
        for cfg in cal_cfgs:
            run = real_run(cfg, None)
            cal_runs.append((cfg.name, run))
            print(f"round {r + 1}: {cfg.name}: {len(run.step_shapes)} steps in {run.wall_s:.1f} s", flush=True)
        for key, cfg in val_cfgs.items():
            run = real_run(cfg, None, keep_inputs=r == 0)
            val_runs[key].append(run)
            print(f"round {r + 1}: {cfg.name}: {len(run.step_shapes)} steps in {run.wall_s:.1f} s", flush=True)
        for key, cfg in val_cfgs.items():  # re-time real run 1 in every round: its medians span the window too
            first = val_runs[key][0]
            assert first.step_inputs is not None
            retimed[key].append(retime(cfg, first.step_inputs, a.retime_passes))
        gc.collect()
    for key, runs in val_runs.items():
        first = runs[0]
        passes = np.concatenate(retimed[key])
        first.steps_retimed, first.retime_passes, first.step_inputs = np.median(passes, axis=0), len(passes), None
    model, rows = calibrate(setup, PRESETS[a.grid], premeasured=cal_runs)
    model.metadata["reference_procedure"] = (
        f"gpu_backend.cpu_reference: {a.rounds} interleaved rounds of {[c.name for c in cal_cfgs]} (calibration) "
        f"and {[c.name for c in val_cfgs.values()]} (validation, never fitted); grid {a.grid}")
    model_path, samples = write_outputs(model, rows, out / "model.json")
    print(f"wrote {model_path} and {samples}")
    for key, cfg in val_cfgs.items():
        vcfg = with_fitted_latency(load_config(VALIDATION[key], a.set), model_path)
        rep = validate(vcfg, out / key, reals=val_runs[key], log=print)
        for line in validation_table(rep["stats"]):
            print("   " + line)
        print(f"   targets all met: {rep['targets'].get('all_met')}")
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
