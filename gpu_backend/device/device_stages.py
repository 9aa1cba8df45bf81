"""One stage of ``gpu_backend/device/device_run.sh``, its results written the moment it ends.

Mirrors nothing in vLLM. ``python -m gpu_backend.device.device_stages STAGE --device D --results DIR
--out OUT [--quick] [--deadline EPOCH]`` runs one of :data:`STAGES` in its own process (a crash, an
out-of-memory or a timeout costs that stage only) and writes

* under ``--results`` (``results/reference/h200_llama3_8b/`` on the GPU): the stage's files --
  ``correctness.json``, ``long_context.json``, ``bench.json``, ``link.json`` (the CPU offload tier's
  GPU<->CPU link: the worker's block copies timed both ways and fitted); ``model.json`` +
  ``model.samples.csv`` (calibration: the path the H200 validation configs read);
  ``validate_chat/``, ``validate_rag/`` report folders -- and ``run.json`` (every stage's status,
  seconds, git commit, package versions, updated after each stage);
* under ``--out`` (``$OUT``, what the device tool brings back even after a timeout): one file per
  stage -- the JSON itself, or ``<stage>.tar.gz`` of its files -- plus ``run.json``, which also
  carries the link stage's result whole: with the preflight's file and the script's log, at most 8
  files, none in a subfolder.

``unpack OUT DIR`` puts what came back into the results layout. Exit status: 0 when the stage
ran and its checks held, 1 when a check failed or the stage crashed, 3 when it was skipped (the
preflight's plan says why). Imports torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STAGES = ("correctness", "long_context", "bench", "link", "calibration", "validation")
IN_RUN_JSON = ("link",)
"""Stages whose whole (small) result rides in ``run.json``'s record instead of a file of its own under
``--out`` (the device tool brings back at most 8 files)."""
ROOT = Path(__file__).resolve().parents[2]
CALIBRATE = {"cuda": ("configs/calibrate_chat_h200.yaml", "configs/calibrate_rag_h200.yaml"),
             "cpu": ("configs/calibrate_chat_cpu.yaml", "configs/calibrate_rag_cpu.yaml")}
VALIDATE = {
    "cuda": {"validate_chat": "configs/validate_chat_h200.yaml", "validate_rag": "configs/validate_rag_h200.yaml"},
    "cpu": {"validate_chat": "configs/validate_chat_cpu.yaml", "validate_rag": "configs/validate_rag_cpu.yaml"},
}


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: object = "") -> None:
        print(line, flush=True)
        self.lines.append(str(line))


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.time()


def run_stage(stage: str, device_name: str, results: Path, *, quick: bool, deadline: float | None,
              log: Log) -> tuple[bool, list[Path], dict[str, Any]]:
    """Run ``stage``; returns (checks held, files written under ``results``, summary)."""
    import torch

    from gpu_backend.device import device_checks as dc

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the 1e-5 check)
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)
    if stage in ("correctness", "long_context", "bench"):
        fn = {"correctness": dc.correctness, "long_context": dc.long_context, "bench": dc.bench}[stage]
        kw: dict[str, Any] = {"budget_s": _left(deadline)} if stage == "bench" else {}
        data = fn(device, quick=quick, log=log, **kw)
        path = results / f"{stage}.json"
        path.write_text(json.dumps(data, indent=1, default=str) + "\n")
        return bool(data["ok"]), [path], {"ok": data["ok"]}
    if stage == "link":
        return _link(device_name, results, quick=quick, log=log)
    if stage == "calibration":
        return _calibration(device_name, results, quick=quick, deadline=deadline, log=log)
    return _validation(device_name, results, quick=quick, deadline=deadline, log=log)


def _retime_passes(device: str) -> int:
    """Re-timing passes of the replays' steps: none on a GPU (steps are stable, time is short), 2 on
    a CPU; calibration and validation take the same, so the fit and the per-step error use one
    estimator of a step's time."""
    return 0 if device == "cuda" else 2


def _link(device: str, results: Path, *, quick: bool, log: Log) -> tuple[bool, list[Path], dict[str, Any]]:
    """The CPU offload tier's link: the offload worker's block copies (``gpu_backend.calibration.link_timing``) of
    the validation model's KV blocks, device -> pinned host and back on CUDA, timed by CUDA events and
    fitted (bandwidth + per-transfer latency), beside the GPU spec's ``host_link_gb_s``. Without CUDA
    the CUDA copies are skipped and the same copies run host <-> host, labelled so: they check the
    stage, not a link."""
    import torch

    from gpu_backend.calibration.calibrate import setup_from_config
    from gpu_backend.calibration.link_timing import measure_link
    from gpu_backend.executor.model import DTYPES

    setup, _ = setup_from_config(str(ROOT / VALIDATE[device]["validate_chat"]))
    cuda = device == "cuda" and torch.cuda.is_available()
    sec = measure_link(device if cuda else "cpu", model_shape=setup.model_shape, dtype=DTYPES[setup.dtype],
                       block_size=setup.block_size, sizes=(1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256),
                       repeats=3 if quick else 9, timing="wall" if cuda else "thread_cpu", log=log)
    if cuda:
        from sim.timing.roofline import list_gpu_specs, load_gpu_spec

        name = torch.cuda.get_device_name(torch.device(device))
        specs = [g for g in list_gpu_specs() if g.split("-")[0].lower() in name.lower()]
        if specs:
            spec = load_gpu_spec(specs[0])
            sec["gpu_spec"] = {"name": spec.name, "host_link_gb_s": spec.host_link_gb_s,
                               "measured_over_spec": sec["bandwidth_gb_s"] / spec.host_link_gb_s}
    else:
        sec["cuda_copies"] = "skipped: no CUDA device (host <-> host copies only)"
    path = results / "link.json"
    path.write_text(json.dumps(sec, indent=1) + "\n")
    ok = sec["bandwidth_gb_s"] > 0 and sec["latency_s"] >= 0 and (not cuda or set(sec["directions"]) == {"d2h", "h2d"})
    return ok, [path], {"ok": ok, **{k: sec[k] for k in ("bandwidth_gb_s", "latency_s", "measured", "directions",
                                                         "samples", "fit")},
                        **{k: sec[k] for k in ("gpu_spec", "cuda_copies") if k in sec}}


def _calibration(device: str, results: Path, *, quick: bool, deadline: float | None,
                 log: Log) -> tuple[bool, list[Path], dict[str, Any]]:
    import importlib.util

    from gpu_backend.calibration.calibrate import calibrate, setup_from_config, write_outputs
    from gpu_backend.calibration.profiling_grid import PRESETS

    setup, _ = setup_from_config(str(ROOT / VALIDATE[device]["validate_chat"]))
    setup.device = device
    has_sim = all(importlib.util.find_spec(m) is not None for m in ("simpy", "pydantic"))
    replays = [str(ROOT / p) for p in CALIBRATE[device]] if has_sim else []
    left = _left(deadline)
    grid_budget = None if left is None else max(10.0, 0.45 * left)
    model, rows = calibrate(setup, PRESETS["gpu" if device == "cuda" else "quick" if quick else "cpu"],
                            replays=replays, replay_overrides=["workload.limit=8"] if quick else [],
                            budget_s=grid_budget, replay_budget_s=None if left is None else 0.4 * left,
                            replay_retime_passes=_retime_passes(device), log=log)
    path, samples = write_outputs(model, rows, results / "model.json")
    fit = model.metadata["fit"]
    return True, [path, samples], {"feature_set": fit["feature_set"], "holdout_mape": fit["holdout"]["all"].get("mape"),
                                   "replays": len(replays)}


def _validation(device: str, results: Path, *, quick: bool, deadline: float | None,
                log: Log) -> tuple[bool, list[Path], dict[str, Any]]:
    from gpu_backend.validation.validate import validate, with_fitted_latency
    from sim.experiment.config import load_config

    model_path = results / "model.json"
    if not model_path.exists():
        raise FileNotFoundError(f"{model_path}: no calibrated model (the calibration stage did not finish)")
    items = list(VALIDATE[device].items())
    files: list[Path] = []
    summary: dict[str, Any] = {}
    for i, (key, cfg_path) in enumerate(items):
        left = _left(deadline)
        per = None if left is None else left / (len(items) - i)
        sets = [f"backend.device={device}"] + (["workload.limit=8"] if quick else [])
        cfg = with_fitted_latency(load_config(ROOT / cfg_path, sets), model_path)
        rep = validate(cfg, results / key, real_runs=2, budget_s=per, retime_passes=_retime_passes(device), log=log)
        files.append(results / key)
        summary[key] = {"targets_all_met": rep["targets"].get("all_met"),
                        "ttft_mape": rep["stats"]["ttft"]["sim_vs_real"].get("mape")}
    return True, files, summary


def _pack(stage: str, files: list[Path], results: Path, out: Path) -> Path:
    if len(files) == 1 and files[0].is_file() and files[0].suffix == ".json":
        dst = out / files[0].name
        shutil.copy(files[0], dst)
        return dst
    dst = out / f"{stage}.tar.gz"
    with tarfile.open(dst, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(results)))
    return dst


def update_run_json(results: Path, out: Path, stage: str, record: dict[str, Any]) -> None:
    from sim.experiment.results import git_commit, package_versions

    path = results / "run.json"
    data = json.loads(path.read_text()) if path.exists() else {"stages": {}}
    data["stages"][stage] = record
    data["git_commit"] = git_commit(ROOT)
    data["versions"] = package_versions()
    text = json.dumps(data, indent=1, default=str) + "\n"
    path.write_text(text)
    (out / "run.json").write_text(text)


def unpack(out: Path, results: Path) -> list[str]:
    """What the device tool brought back (``out``) into the results layout (``results``)."""
    results.mkdir(parents=True, exist_ok=True)
    done = []
    for f in sorted(out.iterdir()):
        if f.name.endswith(".tar.gz"):
            with tarfile.open(f) as tar:
                tar.extractall(results, filter="data")
        elif f.suffix in (".json", ".txt", ".md"):
            shutil.copy(f, results / f.name)
        else:
            continue
        done.append(f.name)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "unpack":
        print("unpacked:", ", ".join(unpack(Path(argv[1]), Path(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--deadline", type=float, default=None, help="epoch seconds by which the stage must be done")
    a = ap.parse_args(argv)
    results, out = Path(a.results), Path(a.out)
    results.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    plan = {}
    pre = out / "preflight.json"
    if pre.exists():
        plan = json.loads(pre.read_text()).get("plan", {})
        shutil.copy(pre, results / "preflight.json")
    if plan.get(a.stage, "run").startswith("skip"):
        print(f"== {a.stage}: {plan[a.stage]}", flush=True)
        update_run_json(results, out, a.stage, {"status": plan[a.stage]})
        return 3
    log = Log()
    t0 = time.perf_counter()
    log(f"== {a.stage} on {a.device}{' (quick)' if a.quick else ''}")
    try:
        ok, files, summary = run_stage(a.stage, a.device, results, quick=a.quick, deadline=a.deadline, log=log)
        status = "ok" if ok else "checks failed"
    except Exception as exc:  # report and let the next stage run
        ok, files, summary = False, [], {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        status = "crashed"
        log(f"== {a.stage} CRASHED: {type(exc).__name__}: {exc}")
    log_path = results / f"{a.stage}.log.txt"
    log_path.write_text("\n".join(log.lines) + "\n")
    packed = _pack(a.stage, [*files, log_path] if len(files) != 1 or files[0].suffix != ".json" else files,
                   results, out) if files and a.stage not in IN_RUN_JSON else None
    update_run_json(results, out, a.stage, {"status": status, "seconds": round(time.perf_counter() - t0, 1),
                                            "summary": summary, "returned_as": packed.name if packed else None})
    log(f"== {a.stage}: {status} in {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
