"""The committed CPU reference (``results/reference/cpu_tiny/``): calibration and validation measured
in one time window, interleaved.

Mirrors nothing in vLLM. On a CPU shared with other processes the machine's speed drifts by tens
of percent within minutes; a model calibrated at one moment and validated at another inherits
that drift as bias. Here the real replays of the calibration workloads (``calibrate_chat``,
``calibrate_rag``, in the first round) and of the held-out validation workloads (``validate_chat``,
``validate_rag``, once per round) are measured in one window, and in every round the steps of
the first calibration replays and of validation real run 1 are all re-timed
(:func:`gpu_backend.executor.real_run.retime`: in replay order, back to back), so a slow spell hits
calibration and validation alike. Calibration and validation then use one estimator of a step's
time -- its median over the re-timing passes: the model is fitted on the calibration replays'
medians and the isolated grid (never on a validation step), and the per-step error is taken
against the validation steps' medians. Each validation report is built from its first two real
runs. ``calibration_steps.csv`` keeps every calibration replay step's single measurement beside its
median (:mod:`gpu_backend.calibration.fit_ablation` refits on either). The commands ``apcsim calibrate
--replay-retime-passes N`` and ``apcsim validate --retime-passes N`` do the same steps one after
the other.

Invariants: the validation workloads never enter the fit; every input and setting is in the
output (model file metadata, report.json: config, git commit, package versions). Imports torch.

    python -m gpu_backend.validation.cpu_reference --out results/reference/cpu_tiny
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_backend.calibration.calibrate import calibrate, setup_from_config, write_outputs
from gpu_backend.calibration.profiling_grid import PRESETS
from gpu_backend.calibration.replay_samples import backend_overrides
from gpu_backend.executor.real_run import RealRun, real_run, retime, steps_table
from gpu_backend.validation.validate import validate, with_fitted_latency
from gpu_backend.validation.validation_report import validation_table
from sim.experiment.config import load_config

CALIBRATION = ("configs/calibrate_chat_cpu.yaml", "configs/calibrate_rag_cpu.yaml")
VALIDATION = {"validate_chat": "configs/validate_chat_cpu.yaml", "validate_rag": "configs/validate_rag_cpu.yaml"}


def write_calibration_steps(runs: Sequence[tuple[str, RealRun]], path: Path) -> None:
    """Every calibration replay step: shape, the replay's single measurement and the re-timed median."""
    tables = [steps_table(run).drop(columns=["predicted_s"]).assign(source=name) for name, run in runs]
    pd.concat(tables, ignore_index=True).to_csv(path, index=False, float_format="%.6g")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds (each: every validation workload once, then re-timing)")
    ap.add_argument("--retime-passes", type=int, default=2,
                    help="re-timing passes of the calibration replays and validation real run 1 in each round")
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
    retimed: dict[str, list[np.ndarray]] = {k: [] for k in (*val_cfgs, *(c.name for c in cal_cfgs))}
    for r in range(a.rounds):
        if r == 0:
            for cfg in cal_cfgs:
                run = real_run(cfg, None, keep_inputs=True)
                cal_runs.append((cfg.name, run))
                print(f"round {r + 1}: {cfg.name}: {len(run.step_shapes)} steps in {run.wall_s:.1f} s", flush=True)
        for key, cfg in val_cfgs.items():
            run = real_run(cfg, None, keep_inputs=r == 0)
            val_runs[key].append(run)
            print(f"round {r + 1}: {cfg.name}: {len(run.step_shapes)} steps in {run.wall_s:.1f} s", flush=True)
        # re-time the calibration replays and validation real run 1 in every round: their medians span the window
        firsts = [*((c, run) for c, (_, run) in zip(cal_cfgs, cal_runs)),
                  *((val_cfgs[k], val_runs[k][0]) for k in val_cfgs)]
        for (cfg, run), key in zip(firsts, [*(c.name for c in cal_cfgs), *val_cfgs]):
            assert run.step_inputs is not None
            t1 = time.perf_counter()
            retimed[key].append(retime(cfg, run.step_inputs, a.retime_passes))
            print(f"round {r + 1}: re-timed {key} ({a.retime_passes} passes) in {time.perf_counter() - t1:.1f} s",
                  flush=True)
        gc.collect()
    for key, run in [*((c.name, run) for c, (_, run) in zip(cal_cfgs, cal_runs)),
                     *((k, runs[0]) for k, runs in val_runs.items())]:
        passes = np.concatenate(retimed[key])
        run.steps_retimed, run.retime_passes, run.step_inputs = np.median(passes, axis=0), len(passes), None
    model, rows = calibrate(setup, PRESETS[a.grid], premeasured=cal_runs)
    model.metadata["reference_procedure"] = (
        f"gpu_backend.validation.cpu_reference: {[c.name for c in cal_cfgs]} (calibration, round 1) and "
        f"{[c.name for c in val_cfgs.values()]} (validation, never fitted) in {a.rounds} rounds, each re-timing every "
        f"step of the calibration replays and of validation real run 1 ({a.retime_passes} passes per round); "
        f"replay samples are the steps' medians over the passes; grid {a.grid}")
    model_path, samples = write_outputs(model, rows, out / "model.json")
    write_calibration_steps(cal_runs, out / "calibration_steps.csv")
    print(f"wrote {model_path}, {samples} and {out / 'calibration_steps.csv'}")
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
