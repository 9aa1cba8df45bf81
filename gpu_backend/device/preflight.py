"""Preflight of ``gpu_backend/device/device_run.sh``: what this machine has, in seconds, one line per
missing piece, and the plan that follows from it.

Mirrors nothing in vLLM. Checks (each degrades to a message, never a crash): the Python packages
the stages need -- torch, numpy, pyyaml (every stage); simpy and pydantic (calibration replays,
validation); scipy (the fit: without it, calibration and validation are skipped); pandas and
matplotlib (validation tables and plots); pyarrow (optional: results in CSV only); triton (optional
on CUDA: the decode kernel, else the attention falls back) --, the device (CUDA present, its name,
free memory), and free disk under the results folder and /tmp. Writes ``preflight.json``; exit
status 0 when the required packages and (for ``--device cuda``) CUDA are there, else 2.

Invariants: imports only the standard library at module level; each package is imported once, in
a try block; the whole check stays within a few seconds (torch's import is the slowest part).

    python -m gpu_backend.device.preflight --device cuda --out $OUT [--results DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# package -> (needed by, consequence when missing); "required" stops the run
PACKAGES: dict[str, tuple[str, str]] = {
    "torch": ("every stage", "required"),
    "numpy": ("every stage", "required"),
    "yaml": ("every stage (pyyaml)", "required"),
    "simpy": ("calibration replays, validation", "calibration uses the grid only; validation skipped"),
    "pydantic": ("calibration replays, validation (configs)", "calibration uses the grid only; validation skipped"),
    "scipy": ("the calibration fit (scipy.optimize.nnls)", "calibration and validation skipped"),
    "pandas": ("validation tables", "validation skipped"),
    "matplotlib": ("validation plots", "validation without plots"),
    "pyarrow": ("parquet tables", "tables written as CSV only"),
    "triton": ("the Triton decode kernel", "decode attention falls back to flash_paged / reference"),
}
WHEELS = "fetch its wheel into .whl/ (gpu_backend/README.md, 'Wheels for the device') and carry .whl"


def check_packages() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, (use, missing) in PACKAGES.items():
        try:
            mod = importlib.import_module(name)
            out[name] = {"ok": True, "version": getattr(mod, "__version__", None)}
        except Exception as exc:  # ImportError, or a broken install
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "needed_by": use, "then": missing}
    return out


def check_device(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"requested": device}
    try:
        import torch
    except Exception:
        return {**info, "ok": False, "error": "torch does not import"}
    info["torch"] = torch.__version__
    if device != "cuda":
        return {**info, "ok": True, "name": "cpu", "threads": torch.get_num_threads()}
    if not torch.cuda.is_available():
        return {**info, "ok": False,
                "error": f"torch {torch.__version__} sees no CUDA device (cuda {torch.version.cuda})"}
    free, total = torch.cuda.mem_get_info()
    p = torch.cuda.get_device_properties(0)
    return {**info, "ok": True, "name": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "free_gib": round(free / 2**30, 1), "total_gib": round(total / 2**30, 1), "cuda": torch.version.cuda}


def check_disk(paths: Sequence[Path]) -> dict[str, float]:
    out = {}
    for p in paths:
        q = p
        while not q.exists() and q != q.parent:
            q = q.parent
        out[str(p)] = round(shutil.disk_usage(q).free / 2**30, 1)
    return out


def plan(pkgs: dict[str, dict[str, Any]], dev: dict[str, Any]) -> dict[str, str]:
    """Which stages run, and how (``run``, ``skip: why`` or ``degraded: how``)."""
    miss = {k for k, v in pkgs.items() if not v["ok"]}
    if miss & {"torch", "numpy", "yaml"} or not dev.get("ok"):
        return dict.fromkeys(STAGES, "skip: preflight failed")
    out = dict.fromkeys(("correctness", "long_context", "bench"), "run")
    out["link"] = "skip: scipy missing" if "scipy" in miss else "run"  # the fit (scipy.optimize.nnls)
    if "scipy" in miss:
        out["calibration"] = "skip: scipy missing"
    elif miss & {"simpy", "pydantic"}:
        out["calibration"] = "degraded: grid only (simpy/pydantic missing)"
    else:
        out["calibration"] = "run"
    if miss & {"scipy", "simpy", "pydantic", "pandas"}:
        out["validation"] = "skip: " + ", ".join(sorted(miss & {"scipy", "simpy", "pydantic", "pandas"})) + " missing"
    elif "matplotlib" in miss:
        out["validation"] = "degraded: no plots"
    else:
        out["validation"] = "run"
    return out


STAGES = ("correctness", "long_context", "bench", "link", "calibration", "validation")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--results", default=None)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    pkgs = check_packages()
    dev = check_device(a.device)
    out = Path(a.out)
    disk = check_disk([out, Path("/tmp"), *([Path(a.results)] if a.results else [])])
    stages = plan(pkgs, dev)
    lines = []
    for name, v in pkgs.items():
        if not v["ok"]:
            _, then = PACKAGES[name]
            fix = "required: " + WHEELS if then == "required" else f"{then}; to have it, {WHEELS}"
            lines.append(f"preflight: MISSING {name} (for {v['needed_by']}): {v['error']} -> {fix}")
    if not dev.get("ok"):
        lines.append(f"preflight: DEVICE {a.device}: {dev.get('error')}")
    elif a.device == "cuda" and dev.get("free_gib", 0) < 24:
        lines.append(f"preflight: LOW GPU MEMORY: {dev.get('free_gib')} GiB free (Llama-3-8B bf16 needs ~16 GiB + KV)")
    for path, gib in disk.items():
        if gib < 1:
            lines.append(f"preflight: LOW DISK: {gib} GiB free under {path}")
    report = {"packages": pkgs, "device": dev, "disk_free_gib": disk, "plan": stages, "python": sys.version.split()[0],
              "messages": lines, "seconds": round(time.perf_counter() - t0, 2)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    for line in lines:
        print(line, flush=True)
    print(f"preflight: {dev.get('name', a.device)}; plan: " + ", ".join(f"{k} {v}" for k, v in stages.items())
          + f" ({report['seconds']} s)", flush=True)
    ok = dev.get("ok") and all(pkgs[k]["ok"] for k in ("torch", "numpy", "yaml"))
    return 0 if ok else 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
