"""A side-channel study: a sweep file (or one experiment file) whose points all carry a
``sidechannel:`` section, run through the sweep machinery (``sim.experiment.sweep``).

Mirrors nothing in vLLM. :func:`load_study` reads a sweep file (``base``/``base_config`` plus
``grid``/``zip`` axes, e.g. salt policy x load x block size x noise x attacker domain) with
:func:`~sim.experiment.sweep_config.load_sweep`, or an experiment file as a one-point sweep whose
folder is ``<output_dir>/<name>/``; :func:`run_study` runs it (resume, local processes or Ray,
atomic point folders, exactly as ``apcsim sweep``: each point computed by
``sim.experiment.sidechannel.point``) and writes ``meta.json`` (git commit, package versions,
wall time) beside the table.

Invariants: every point has a ``sidechannel`` section (else ``ConfigError`` before anything runs).
Imports neither torch nor ``sim.analysis``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sim.experiment.config import ConfigError, load_config, load_yaml
from sim.experiment.results import run_metadata, write_json
from sim.experiment.sweep import SweepReport, run_sweep
from sim.experiment.sweep_config import Point, Sweep, load_sweep, point_key

_SWEEP_MARKS = {"base", "base_config", "grid", "zip"}


def load_study(path: str | Path, output_dir: str | None = None, overrides: list[str] | None = None) -> Sweep:
    """The study of ``path`` (a sweep file or one experiment file); validated before anything runs."""
    path = Path(path)
    data = load_yaml(path)
    if isinstance(data, dict) and _SWEEP_MARKS & set(data):
        sweep = load_sweep(path, output_dir, overrides)
    else:
        cfg = load_config(path, overrides)
        sweep = Sweep(cfg.name, path, output_dir if output_dir is not None else cfg.output_dir, "", False, [],
                      [Point(0, {}, {}, cfg, point_key(cfg, False))])
    for p in sweep.points:
        if p.config.sidechannel is None:
            where = ", ".join(f"{k}={v}" for k, v in p.axes.items()) or "the only point"
            raise ConfigError(f"{path}: sidechannel: required in every point of a side-channel study ({where})")
    return sweep


def run_study(sweep: Sweep, *, workers: int | None = None, ray: bool = False, ray_address: str | None = None,
              resume: bool = True, progress: bool | None = None) -> SweepReport:
    """Run every point (skipping finished ones) and write the table and ``meta.json``."""
    t0 = time.perf_counter()
    report = run_sweep(sweep, workers=workers, ray=ray, ray_address=ray_address, resume=resume, progress=progress)
    extra: dict[str, Any] = {"points": len(sweep.points), "ran": report.ran, "skipped": report.skipped,
                             "failed": len(report.errors)}
    write_json(report.folder / "meta.json", run_metadata(time.perf_counter() - t0, extra))
    return report
