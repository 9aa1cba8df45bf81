"""The results folder of ``apcsim run``: replaced whole, locked, checked before the
replay, marked complete; parquet by default, CSV on request; skipped-line counts in the summary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli.main import main
from sim.experiment import results_folder as rf_mod
from sim.experiment import run as run_mod
from sim.experiment.config import load_config
from sim.experiment.results_folder import ResultsError, ResultsFolder, recover, require_complete
from sim.experiment.run import run_experiment

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "name": "rf",
    "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
    "latency": {"kind": "fixed", "step_time_s": 0.02},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 8, "prefix_tokens": 64,
                 "suffix_tokens": 16, "output_tokens": 2, "rate": 50.0},
}


def _cfg(tmp_path: Path, overrides: list[str] | None = None, data: dict | None = None):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(data or SMALL))
    return load_config(p, overrides)


def test_parquet_by_default_csv_on_request(tmp_path, capsys):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "a")]) == 0
    assert sorted(os.listdir(tmp_path / "a")) == [
        "config.resolved.yaml", "meta.json", "requests.parquet", "steps.parquet", "summary.json"]
    assert main(["run", str(p), "--no-progress", "--csv", "--out", str(tmp_path / "b")]) == 0
    assert {"requests.csv", "steps.csv"} <= set(os.listdir(tmp_path / "b"))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "b" / "requests.csv")[["request_id", "hit_tokens"]],
                                  pd.read_parquet(tmp_path / "b" / "requests.parquet")[["request_id", "hit_tokens"]])
    assert load_config(p, ["replay.tables=[csv]"]).replay.tables == ("csv",)


def test_meta_carries_the_complete_marker_and_a_run_id(tmp_path):
    _, folder = run_experiment(_cfg(tmp_path), out=tmp_path / "o", progress=False)
    meta = require_complete(folder)
    assert meta["complete"] is True and len(meta["run_id"]) == 32
    (folder / "meta.json").write_text(json.dumps({**meta, "complete": False}))
    with pytest.raises(ResultsError, match="not a complete results folder"):
        require_complete(folder)


def test_extra_files_are_swapped_in_with_the_rest_or_not_at_all(tmp_path):
    """A caller's files (a fleet's replicas.csv and load figure) are written before the swap."""
    out = tmp_path / "o"
    run_experiment(_cfg(tmp_path), out=out, progress=False)
    old = sorted(os.listdir(out))

    def fails(folder: Path, result) -> None:
        (folder / "extra.txt").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(ResultsError, match="could not write the results"):
        run_experiment(_cfg(tmp_path, ["engine.block_size=64"]), out=out, progress=False, extras=fails)
    assert sorted(os.listdir(out)) == old  # the previous complete results, untouched
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["engine"]["block_size"] == 16
    cl = tmp_path / "cl"
    assert main(["run", str(ROOT / "configs/quickstart.yaml"), "--set", "workload.limit=40", "--set",
                 "cluster.compare=[]", "--no-bounds", "--no-progress", "--out", str(cl)]) == 0
    names = set(os.listdir(cl))
    assert {"replicas.csv", "load_timeline.png", "load_timeline.svg", "meta.json"} <= names
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".tmp-", ".old-"))]


def test_rerun_replaces_the_folder_whole(tmp_path):
    """An old kv_events.jsonl (or csv) never survives beside a newer run's tables."""
    out = tmp_path / "o"
    run_experiment(_cfg(tmp_path, ["replay.record_events=true", "replay.tables=[parquet, csv]"]), out=out,
                   progress=False)
    assert (out / "kv_events.jsonl").is_file() and (out / "requests.csv").is_file()
    run_experiment(_cfg(tmp_path, ["engine.block_size=64"]), out=out, progress=False)
    assert sorted(os.listdir(out)) == [
        "config.resolved.yaml", "meta.json", "requests.parquet", "steps.parquet", "summary.json"]
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["engine"]["block_size"] == 64
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".tmp-", ".old-"))]


def test_a_second_run_on_the_same_folder_refuses_at_once(tmp_path, capsys, monkeypatch):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "o"
    with ResultsFolder(out):  # another run holds the lock
        monkeypatch.setattr(run_mod, "replay_experiment", _must_not_replay)
        assert main(["run", str(p), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"apcsim: error: {out}: another apcsim run is writing these results (lock {tmp_path}/.o.lock); "
                   f"wait for it to finish or pick another --out\n")
    monkeypatch.undo()
    assert main(["run", str(p), "--no-progress", "--out", str(out)]) == 0  # the lock died with its holder


def _must_not_replay(*a, **k):
    raise AssertionError("the replay ran before the output folder was checked")


@pytest.mark.parametrize("where", ["file_in_place", "file_as_parent", "not_a_directory"])
def test_unwritable_output_fails_before_the_replay(tmp_path, capsys, monkeypatch, where):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    if where == "file_in_place":
        out = tmp_path / "o"
        out.write_text("not a folder")
        expect = f"{out}: exists and is not a folder"
    elif where == "file_as_parent":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "o"
        expect = f"{out}: cannot create the folder {tmp_path / 'f'}"
    else:
        out = Path("/dev/null/o")
        expect = f"{out}: cannot create the folder /dev/null"
    monkeypatch.setattr(run_mod, "replay_experiment", _must_not_replay)
    assert main(["run", str(p), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"apcsim: error: {expect}") and err.count("\n") == 1, err


def test_a_folder_with_other_files_is_not_replaced(tmp_path, capsys):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["run", str(p), "--no-progress", "--out", str(tmp_path / "mine")]) == 2
    assert "holds files that are not apcsim results (notes.txt)" in capsys.readouterr().err
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_a_writer_of_other_results_names_the_files_it_may_replace(tmp_path):
    """A benchmark's folder holds its own files: with its ``allowed`` it is replaced whole, while
    the default (an ``apcsim run``'s files) and a foreign file still refuse."""
    target = tmp_path / "bench"
    target.mkdir()
    (target / "table.md").write_text("old")
    with pytest.raises(ResultsError, match=r"not apcsim results \(table.md\)"):
        ResultsFolder(target).open()
    ours = {"table.md", "meta.json"}.__contains__
    folder = ResultsFolder(target, allowed=ours).open()
    try:
        assert folder.tmp is not None
        (folder.tmp / "table.md").write_text("new")
        folder.commit()
    finally:
        folder.close()
    assert (target / "table.md").read_text() == "new"
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(ResultsError, match=r"not apcsim results \(notes.txt\)"):
        ResultsFolder(target, allowed=ours).open()


def test_results_of_an_older_apcsim_are_replaced(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    for name in ("requests.csv", "steps.csv", "summary.json", "meta.json", ".requests.csv.tmp"):
        (out / name).write_text("old")
    run_experiment(_cfg(tmp_path), out=out, progress=False)
    assert "requests.csv" not in os.listdir(out) and require_complete(out)["complete"]


def test_swap_without_renameat2_and_recovery_after_a_kill_between_its_renames(tmp_path, monkeypatch):
    out = tmp_path / "o"
    run_experiment(_cfg(tmp_path), out=out, progress=False)
    old_id = require_complete(out)["run_id"]
    monkeypatch.setattr(rf_mod, "_exchange", lambda a, b: False)
    run_experiment(_cfg(tmp_path, ["seed=3"]), out=out, progress=False)
    new_id = require_complete(out)["run_id"]
    assert new_id != old_id and not [p for p in os.listdir(tmp_path) if p.startswith((".tmp-", ".old-"))]
    # killed between "final -> .old-" and "tmp -> final": no folder, the complete old one aside
    os.rename(out, tmp_path / ".old-o-0123456789ab")
    (tmp_path / ".tmp-o-cafecafecafe").mkdir()
    (tmp_path / ".tmp-o-2-cafecafecafe").mkdir()  # another folder's ("o-2"): not ours to touch
    recover(out)
    assert require_complete(out)["run_id"] == new_id
    assert sorted(os.listdir(tmp_path)) == [".o.lock", ".tmp-o-2-cafecafecafe", "exp.yaml", "o"]


def test_skipped_lines_are_counted_in_the_summary(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"id": i, "arrival": 0.1 * i, "tokens": list(range(10 * i, 10 * i + 20)), "output_tokens": 2}
             for i in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in lines).replace('"output_tokens": 2}', '"output_tokens": -1}', 1)
    trace.write_text(text + "not json\n")
    data = {**SMALL, "workload": {"kind": "trace", "path": str(trace), "skip_bad_lines": True}}
    result, folder = run_experiment(_cfg(tmp_path, data=data), out=tmp_path / "o", progress=False)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["skipped_bad_lines"] == 2 and summary["num_requests"] == 3
    assert json.loads((folder / "meta.json").read_text())["skipped_line_numbers"] == [1, 5]
    gen, _ = run_experiment(_cfg(tmp_path), out=tmp_path / "g", progress=False)
    assert gen.summary["skipped_bad_lines"] == 0


def test_sweep_rows_carry_the_skipped_line_count(tmp_path):
    from sim.experiment.sweep import run_sweep

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"id": i, "arrival": 0.1 * i, "tokens": list(range(20)),
                                         "output_tokens": 2}) + "\n" for i in range(3)) + "{bad\n")
    base = {**SMALL, "workload": {"kind": "trace", "path": str(trace), "skip_bad_lines": True}}
    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump({"name": "sk", "base": base, "grid": {"engine.block_size": [16, 32]},
                                  "bounds": False}))
    rep = run_sweep(sw, workers=1, progress=False, output_dir=str(tmp_path / "sweeps"))
    assert list(rep.table["skipped_bad_lines"]) == [1, 1] and list(rep.table["status"]) == ["ok", "ok"]


def test_plot_refuses_an_incomplete_sweep_folder_and_sweeps_rerun_unmarked_points(tmp_path, capsys):
    from sim.experiment.sweep import run_sweep

    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump({"name": "pl", "base": SMALL, "grid": {"engine.block_size": [16, 32]},
                                  "bounds": False}))
    rep = run_sweep(sw, workers=1, progress=False, output_dir=str(tmp_path / "sweeps"))
    assert json.loads((rep.folder / "sweep.json").read_text())["complete"] is True
    manifest = json.loads((rep.folder / "sweep.json").read_text())
    (rep.folder / "sweep.json").write_text(json.dumps({**manifest, "complete": False}))
    assert main(["plot", str(rep.folder)]) == 2
    assert "not a complete sweep folder" in capsys.readouterr().err
    # a point whose meta.json lacks the marker is not finished: the next run does it again
    point = rep.folder / "points" / rep.table["key"][0]
    meta = json.loads((point / "meta.json").read_text())
    (point / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "complete"}))
    again = run_sweep(sw, workers=1, progress=False, output_dir=str(tmp_path / "sweeps"))
    assert (again.ran, again.skipped) == (1, 1)
    assert json.loads((point / "meta.json").read_text())["complete"] is True


def test_two_concurrent_runs_on_one_folder_never_mix(tmp_path):
    """Two ``apcsim run`` processes on the same folder at once: the one that finds it locked
    refuses with the lock message; the folder is one run's complete results."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump({**SMALL, "workload": {**SMALL["workload"], "num_requests": 300}}))
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-m", "sim.cli", "run", str(p), "--no-progress", "--out", str(out),
                               "--set", f"seed={i}"], cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (1, 2)]
    results = [(proc.wait(timeout=300), proc.communicate()[1]) for proc in procs]
    assert any(code == 0 for code, _ in results), results
    for code, err in results:
        assert code == 0 or "another apcsim run is writing these results" in err, (code, err)
    meta = require_complete(out)
    seed = yaml.safe_load((out / "config.resolved.yaml").read_text())["seed"]
    winners = [i for (code, _), i in zip(results, (1, 2)) if code == 0]
    assert seed in winners  # the results of a run that succeeded, never of the refused one
    assert sorted(os.listdir(out)) == [
        "config.resolved.yaml", "meta.json", "requests.parquet", "steps.parquet", "summary.json"]
    assert meta["argv"][-1] == f"seed={seed}"
