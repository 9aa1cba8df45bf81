"""Writing a run's results folder (mirrors nothing in vLLM: the simulator's output format).

``results/<name>/`` holds:

* ``requests.parquet`` -- one row per request (see ``sim.replay.metrics``), ``requests.csv`` too
  with ``replay.tables: [parquet, csv]`` (``apcsim run --csv``; CSV instead of parquet where
  pyarrow is not installed, e.g. a bare GPU image);
* ``steps.parquet`` (``steps.csv``) -- one row per engine step;
* ``summary.json`` -- headline metrics (deterministic: same config and seed, same bytes);
* ``config.resolved.yaml`` -- the validated config with every default filled in;
* ``kv_events.jsonl`` -- KV cache events with their step, when ``replay.record_events`` is on;
* ``blocks.parquet`` -- one row per prompt block of every request at its first admission, with its
  miss cause, when ``replay.attribution`` is ``full`` (``sim.replay.attribution_records``; parquet
  only: it has a row per block);
* ``compared_requests.parquet`` / ``compared_blocks.parquet`` -- a cluster run with
  ``replay.attribution`` and ``cluster.compare``: the compared routers' requests and block rows,
  with a ``router`` column (``sim.experiment.cluster_run``, for ``apcsim explain --router``);
* ``meta.json`` -- git commit, package versions, platform, wall time, ``run_id`` (differ run to
  run) and ``complete: true``; written last.

The folder is replaced whole or not at all (``sim.experiment.results_folder``): the files go into
a private temporary folder beside it, which is then swapped in, so no file of an older run
survives beside newer ones and an interrupted run leaves the previous results.

Invariants: a folder holds one run's complete results or is not there; ``summary.json`` is
deterministic. Imports neither simpy nor torch.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.core.kv_events import event_to_dict
from sim.experiment.results_folder import ResultsError, ResultsFolder, os_problem
from sim.replay.metrics import Frame, as_frame
from sim.replay.table import Table

if TYPE_CHECKING:  # pandas (and pyarrow, which it loads) are imported by the tables, when written
    import pandas as pd

_PACKAGES = ("apcsim", "numpy", "pandas", "pyarrow", "simpy", "pydantic", "pyyaml", "torch", "matplotlib", "scipy",
             "scikit-learn")


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The checkout's HEAD commit (with ``-dirty`` if the tree has changes), or None."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_metadata(wall_time_s: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "git_commit": git_commit(),
        "versions": package_versions(),
        "platform": platform.platform(),
        "argv": sys.argv,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_time_s": wall_time_s,
    }
    if extra:
        meta.update(extra)
    return meta


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _atomic_write(path: Path, write: Any) -> None:
    """Write ``path`` through a private temporary name in its folder, then rename it into place
    (a file is complete or absent; two writers never share a temporary file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")  # created by ``write``: the umask applies
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    text = json.dumps(_json_safe(data), indent=2, sort_keys=True) + "\n"
    _atomic_write(path, lambda p: p.write_text(text))


def _parquet_writer(table: Frame) -> Callable[[Path], None]:
    """The writer of ``table`` as parquet: a Table straight through pyarrow (no pandas import;
    the file reads back as the DataFrame pandas would have written), unless Arrow cannot type a
    column of it alone (mixed types), which pandas then writes as before."""
    if isinstance(table, Table):
        import pyarrow as pa  # ImportError: the caller writes CSV instead
        import pyarrow.parquet as pq

        try:
            arrow = table.to_arrow()
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column of mixed types: pandas types it
            df = table.to_frame()
            return lambda p: df.to_parquet(p, index=False)

        def write(p: Path) -> None:
            with open(p, "wb") as fh:  # opened here, as pandas does: a full disk is an OSError of ours
                pq.write_table(arrow, fh)

        return write
    return lambda p: table.to_parquet(p, index=False)


def write_table(out_dir: Path, name: str, df: Frame, formats: Sequence[str] = ("parquet", "csv")) -> None:
    """``<name>.parquet`` and/or ``<name>.csv`` in ``out_dir`` from a DataFrame or a
    :class:`~sim.replay.table.Table`; CSV in place of parquet where no parquet engine (pyarrow)
    is installed (e.g. a bare GPU image)."""
    csv = "csv" in formats
    if "parquet" in formats:
        try:
            _atomic_write(out_dir / f"{name}.parquet", _parquet_writer(df))
        except ImportError:  # no pyarrow: the table still lands, as CSV
            csv = True
    if csv:
        frame = as_frame(df)
        _atomic_write(out_dir / f"{name}.csv", lambda p: frame.to_csv(p, index=False))


def _write_files(
    folder: Path, *, config: dict[str, Any], requests: Frame, steps: Frame,
    summary: dict[str, Any], events: list[tuple[int, Any]] | None, tables: Sequence[str],
    blocks: pd.DataFrame | None = None, extras: Callable[[Path], None] | None = None,
) -> None:
    write_table(folder, "requests", requests, tables)
    write_table(folder, "steps", steps, tables)
    write_json(folder / "summary.json", summary)
    text = yaml.safe_dump(config, sort_keys=False)
    _atomic_write(folder / "config.resolved.yaml", lambda p: p.write_text(text))
    if events:
        lines = "".join(json.dumps({"step": s, **event_to_dict(e)}) + "\n" for s, e in events)
        _atomic_write(folder / "kv_events.jsonl", lambda p: p.write_text(lines))
    if blocks is not None:
        _atomic_write(folder / "blocks.parquet", lambda p: blocks.to_parquet(p, index=False))
    if extras is not None:
        extras(folder)


def fill_and_commit(rf: ResultsFolder, meta: dict[str, Any], write_files: Callable[[Path], None]) -> Path:
    """Fill the open ``rf``: ``write_files(tmp)``, then ``meta.json`` last with this run's
    ``run_id`` and ``complete: true`` (the marker says every other file is there); swap it in.
    A write that fails (a full disk) drops the temporary folder and raises :class:`ResultsError`
    saying what the folder holds now. Every results writer ends through here."""
    if rf.tmp is None:
        raise ResultsError(f"{rf.final}: the results folder is not open")
    rf.run_id = uuid.uuid4().hex
    try:
        write_files(rf.tmp)
        write_json(rf.tmp / "meta.json", {**meta, "run_id": rf.run_id, "complete": True})
        return rf.commit()
    except OSError as exc:
        rf.abort()
        raise ResultsError(
            f"{rf.final}: could not write the results ({os_problem(exc)}); {rf.state(rf.run_id)}"
        ) from None


def write_results(
    out_dir: Path,
    *,
    config: dict[str, Any],
    requests: Frame,
    steps: Frame,
    summary: dict[str, Any],
    meta: dict[str, Any],
    events: list[tuple[int, Any]] | None = None,
    tables: Sequence[str] = ("parquet",),
    folder: ResultsFolder | None = None,
    blocks: pd.DataFrame | None = None,
    extras: Callable[[Path], None] | None = None,
) -> Path:
    """Write every result file of one run as the folder ``out_dir``, replacing it whole.

    ``extras(folder)`` writes the run's other files (a fleet's ``replicas.csv``, figures) into the
    folder before ``meta.json``, so they are swapped in with the rest or not at all.

    ``folder``: a :class:`ResultsFolder` for ``out_dir`` opened before the replay (so that an
    unwritable location fails early); else one is opened here. ``meta`` gains ``run_id`` and
    ``complete: true``. A write that fails (a full disk) raises :class:`ResultsError` saying what
    the folder holds now."""
    rf = folder if folder is not None else ResultsFolder(out_dir).open()
    try:
        return fill_and_commit(rf, meta, lambda tmp: _write_files(
            tmp, config=config, requests=requests, steps=steps, summary=summary, events=events, tables=tables,
            blocks=blocks, extras=extras))
    finally:
        if folder is None:
            rf.close()
