"""A sweep survives a worker process that dies: the point it ran is retried once alone,
then recorded as failed with the reason; the other points run and the table is written."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml

from sim.cli.main import main
from sim.experiment import sweep_pool
from sim.experiment.sweep import run_sweep
from sim.experiment.sweep_point import run_and_commit

BASE = {
    "name": "dw",
    "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
    "latency": {"kind": "fixed", "step_time_s": 0.02},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 6, "prefix_tokens": 64,
                 "suffix_tokens": 16, "output_tokens": 2, "rate": 50.0},
}
DOOMED_SEED = 2


def _dying_run_and_commit(task: dict, points_dir: str) -> dict:
    """The worker entry point, except that the worker running seed 2 is SIGKILLed: every time,
    or only the first time when $APCSIM_TEST_DIE_ONCE names a marker file."""
    if task["config"]["seed"] == DOOMED_SEED:
        marker = os.environ.get("APCSIM_TEST_DIE_ONCE")
        if marker is None or not Path(marker).exists():
            if marker is not None:
                Path(marker).write_text("died once")
            os.kill(os.getpid(), signal.SIGKILL)
    return run_and_commit(task, points_dir)


@pytest.fixture
def sweep_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(sweep_pool, "run_and_commit", _dying_run_and_commit)  # inherited by forked workers
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump({"name": "dw", "base": BASE, "grid": {"seed": [0, 1, 2, 3, 4]}, "bounds": False}))
    return p


def test_a_point_whose_worker_always_dies_is_recorded_failed(tmp_path, sweep_file):
    rep = run_sweep(sweep_file, workers=2, progress=False, output_dir=str(tmp_path / "out"))
    table = rep.table.set_index("seed")
    assert list(table["status"]) == ["ok", "ok", "error", "ok", "ok"]
    assert table.loc[DOOMED_SEED, "error"] == (
        "WorkerDied: the worker process died twice running this point (last time: killed by SIGKILL)")
    assert rep.ran == 5 and [p for p, _ in rep.errors] == [2]
    assert (rep.folder / "table.parquet").is_file()
    assert json.loads((rep.folder / "sweep.json").read_text())["complete"] is True
    point = rep.folder / "points" / table.loc[DOOMED_SEED, "key"]
    assert (point / "error.txt").read_text().startswith("WorkerDied: ")


def test_a_worker_that_dies_once_is_retried(tmp_path, sweep_file, monkeypatch):
    monkeypatch.setenv("APCSIM_TEST_DIE_ONCE", str(tmp_path / "died"))
    rep = run_sweep(sweep_file, workers=2, progress=False, output_dir=str(tmp_path / "out"))
    assert (tmp_path / "died").exists()  # it did die
    assert list(rep.table["status"]) == ["ok"] * 5 and not rep.errors


def test_apcsim_sweep_exits_1_and_names_the_dead_point(tmp_path, sweep_file, capsys):
    code = main(["sweep", str(sweep_file), "--workers", "2", "--no-plots", "--no-progress",
                 "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1
    assert "point 2: WorkerDied: the worker process died twice running this point (last time: killed by SIGKILL)" in out
