"""``apcsim sweep``: run every point of a sweep file and collect one tidy table (mirrors nothing in
vLLM: a benchmark grid over its engine arguments).

The sweep folder ``<output_dir>/<name>/`` holds:

* ``points/<key>/`` -- one folder per point, written atomically (``sim.experiment.sweep_point``), keyed by the
  hash of the point's resolved config (``sim.experiment.sweep_config.point_key``);
* ``table.parquet`` / ``table.csv`` -- one row per point: ``point`` (its index), the axes as
  columns (their labels), derived facts (``block_size``, ``num_gpu_blocks``, ``kv_pool_gib``,
  ``capacity_tokens``, ``workload_kind``, ``salt_policy``, ``num_tenants``, ...), every summary
  metric of ``apcsim run`` (``token_hit_rate`` -- vLLM's definition --, ``request_hit_rate``,
  ``ttft_p50_s``, ..., nested ones flattened as ``prefix_cache.hits``), the offline bounds
  (``infinite_cache_hit_rate``, ``belady_hit_rate``, ``lru_sequential_hit_rate``), ``status``
  (``ok`` / ``error`` / ``missing``), ``error``, ``key`` and the wall times;
* ``sweep.json`` -- the sweep's axes, every point's key and ``complete`` (false while the sweep runs,
  true once the table is written: ``apcsim plot`` refuses a folder without it); ``sweep.yaml`` --
  a copy of the file;
* the plots, drawn afterwards by ``apcsim sweep`` (``sim.cli.sweep``) or ``apcsim plot`` with
  ``sim.analysis.plots``: this module stays below the analysis layer.

Resume: a point whose folder holds an ``ok`` row (and a ``meta.json`` with ``complete: true``) and
whose input files still match the fingerprint stored beside it (``inputs.json``: size and SHA-256
of every trace / latency / spec file the point reads, ``sim.experiment.input_files``) is skipped;
a point whose inputs changed runs again and replaces its folder; ``error`` points are retried;
``--no-resume`` reruns everything. Killing the sweep (even ``kill -9``) loses no finished point and
leaves no half-written one: leftovers ``points/.tmp-*`` are removed by the next run. A lock file
keeps two sweeps from writing one folder at once.

Execution: a local process pool (all cores by default; ``workers=1`` runs in this process; a point
whose worker process dies is retried once alone, then recorded as failed: ``sim.experiment.sweep_pool``), or Ray
tasks (``ray=True``; ``ray_address`` joins a running cluster, else a local Ray instance starts).
Ray workers need apcsim installed and the input files at the same paths; they send results back
and this process writes them, so the cluster needs no shared file system.

A worker builds each request stream once per run and hands it to every point replaying it
(``sim.experiment.workload.shared_workload``; points with the same stream run next to each other).

Invariants: a point folder is complete or absent; the table is in point order whatever order the
points ran in. Imports neither torch nor ``sim.analysis`` (simpy only inside the workers, through
``sim.experiment.run``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.errors import ApcsimError
from sim.experiment.config import ConfigError, ExperimentConfig
from sim.experiment.input_files import FingerprintCache, fingerprint, input_files, same_inputs
from sim.experiment.results import _atomic_write, write_json, write_table
from sim.experiment.sweep_config import Point, Sweep, load_sweep
from sim.experiment.sweep_point import (
    WALL_COLUMNS,
    commit_point,
    compute_point,
    error_result,
    read_inputs,
    read_row,
)
from sim.experiment.sweep_pool import run_local
from sim.experiment.workload import release_shared

TABLE = "table"
FRONT_COLUMNS = (
    "workload_kind", "model", "gpu", "seed", "block_size", "num_gpu_blocks", "kv_pool_gib", "capacity_tokens",
    "salt_policy", "num_tenants", "token_hit_rate", "request_hit_rate", "infinite_cache_hit_rate",
    "belady_hit_rate", "lru_sequential_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
)
"""Table columns right after the axes (the rest follow in name order)."""


@dataclass
class SweepReport:
    """What a sweep run did."""

    folder: Path
    table: pd.DataFrame
    ran: int = 0
    skipped: int = 0
    stale: int = 0  # finished points rerun because an input file changed (sim.experiment.input_files)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (point, message)
    wall_time_s: float = 0.0


class SweepLock:
    """An exclusive, non-blocking lock on ``<folder>/.lock`` (released by the OS on any exit)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> SweepLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover  (no fcntl: no locking)
            pass
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise ConfigError(f"{self.path.parent}: another sweep is running in this folder") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _clean_leftovers(points_dir: Path) -> None:
    if not points_dir.is_dir():
        return
    for p in points_dir.iterdir():
        if p.name.startswith((".tmp-", ".trash-")):
            shutil.rmtree(p, ignore_errors=True)


def _unique_tasks(points: Iterable[Point]) -> list[Point]:
    """One point per key (two axis combinations may resolve to the same config)."""
    seen: dict[str, Point] = {}
    for p in points:
        seen.setdefault(p.key, p)
    return list(seen.values())


def _stream_order(p: Point) -> tuple[str, str, int]:
    """Points sharing a stream and block-size settings run next to each other (their bounds share
    work); the settings, not the resolved size, so that ordering resolves no engine."""
    import json

    w = p.config.workload.model_dump(mode="json")
    sizes = p.config.engine.model_dump(mode="json", include={"block_size", "kv_cache_groups", "hash_block_size"})
    return (json.dumps([w, p.config.seed], sort_keys=True, default=str), json.dumps(sizes, sort_keys=True), p.index)


def _bar(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no monitor thread (workers are forked after the bar exists)

    return Bar(total=total, desc=desc, unit="pt", disable=not enabled, smoothing=0.1, dynamic_ncols=True)


def _task_memory(cfg: ExperimentConfig) -> int | None:
    """The memory a point will take, as its Ray task asks for it (``sim.experiment.cluster_run
    .config_memory``: the fleet's pools, at most as many as the stream has requests, and the
    process); None when it cannot be estimated (the point itself will say why)."""
    from sim.experiment.cluster_run import config_memory

    try:
        return config_memory(cfg).total_bytes
    except ApcsimError:
        return None


def _run_ray(tasks: list[dict[str, Any]], points_dir: Path, workers: int | None, address: str | None,
             on_row: Callable[[dict], None], replace: bool, memory: dict[str, int | None] | None = None) -> None:
    """Run the points as Ray tasks, each asking for one CPU and the memory ``memory[key]`` (bytes:
    Ray's ``memory`` resource, so a node runs only as many points as its memory holds)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install -e '.[ray]'") from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        elif workers:
            kwargs["num_cpus"] = workers
        ray.init(**kwargs)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(compute_point)
        mem = memory or {}
        refs = {(remote.options(memory=mem[t["key"]]) if mem.get(t["key"]) else remote).remote(t): t["key"]
                for t in tasks}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                key = refs.pop(ref)
                try:
                    row, files = ray.get(ref)
                except Exception as exc:  # the task itself died (worker crash, lost node): record it
                    row, files = error_result(key, exc, worker=False)
                commit_point(points_dir, key, files, replace=replace)
                on_row(row)
    finally:
        if started:
            ray.shutdown()


def _uniform(col: pd.Series) -> pd.Series:
    """Axis labels of mixed types (e.g. 16 and 'auto') become strings so parquet accepts them."""
    kinds = {type(v) for v in col if v is not None and not (isinstance(v, float) and pd.isna(v))}
    if kinds <= {int, float} or kinds <= {bool} or kinds <= {str} or not kinds:
        return col
    return col.map(lambda v: None if v is None else str(v))


def collect_table(sweep: Sweep, folder: Path) -> pd.DataFrame:
    """The tidy table from ``points/`` (one row per point, in point order)."""
    points_dir = folder / "points"
    rows: list[dict[str, Any]] = []
    for p in sweep.points:
        stored = read_row(points_dir / p.key) or {"status": "missing", "error": None}
        row: dict[str, Any] = {"point": p.index, **p.axes}
        row.update({k: v for k, v in stored.items() if k not in ("key",) and k not in p.axes})
        row["key"] = p.key
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in sweep.axis_keys:
        if k in df:
            df[k] = _uniform(df[k])
    lead = ["point", *sweep.axis_keys]
    tail = ["status", "error", "key", *WALL_COLUMNS]
    front = [c for c in FRONT_COLUMNS if c not in lead]
    middle = front + sorted(c for c in df.columns if c not in lead and c not in tail and c not in front)
    return df[[c for c in lead + middle + tail if c in df.columns]]


def write_sweep_table(sweep: Sweep, folder: Path) -> pd.DataFrame:
    df = collect_table(sweep, folder)
    write_table(folder, TABLE, df)
    return df


def run_sweep(
    sweep: Sweep | str | Path,
    *,
    workers: int | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    resume: bool = True,
    progress: bool | None = None,
    output_dir: str | None = None,
) -> SweepReport:
    """Run (or resume) a sweep; returns the report with the tidy table."""
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep, output_dir)
    folder = sweep.folder()
    folder.mkdir(parents=True, exist_ok=True)
    points_dir = folder / "points"
    t0 = time.perf_counter()
    report = SweepReport(folder, pd.DataFrame())
    with SweepLock(folder) as lock:
        _clean_leftovers(points_dir)
        write_json(folder / "sweep.json", {**sweep.manifest(), "complete": False})  # true once the table is
        text = sweep.path.read_text()
        _atomic_write(folder / "sweep.yaml", lambda p: p.write_text(text))
        unique = _unique_tasks(sweep.points)
        todo: list[Point] = []
        stale: set[str] = set()
        cache = FingerprintCache()  # each input file hashed once per sweep run
        inputs = {p.key: fingerprint(input_files(p.config), cache) for p in unique}
        for p in unique:
            row = read_row(points_dir / p.key) if resume else None
            if row is not None and row.get("status") == "ok":
                if same_inputs(read_inputs(points_dir / p.key), inputs[p.key]):
                    report.skipped += 1
                    continue
                stale.add(p.key)  # finished on inputs that have changed since: rerun, replace
            todo.append(p)
        todo.sort(key=_stream_order)
        run = uuid.uuid4().hex  # the workers share streams within this run only (shared_workload)
        report.stale = len(stale)
        tasks = [{**p.task(sweep.bounds, sweep.keep_steps), "replace": not resume or p.key in stale, "run": run,
                  "inputs": inputs[p.key]} for p in todo]
        index_of = {p.key: p.index for p in todo}
        n_workers = workers if workers is not None else (os.cpu_count() or 1)
        show = sys.stderr.isatty() if progress is None else progress
        bar = _bar(len(tasks), f"sweep {sweep.name}", show)
        if report.skipped:
            bar.set_postfix_str(f"{report.skipped} finished earlier, skipped")

        def on_row(row: dict[str, Any]) -> None:
            report.ran += 1
            if row.get("status") != "ok":
                report.errors.append((index_of.get(row.get("key", ""), -1), str(row.get("error"))))
            bar.update(1)

        try:
            if ray:
                _run_ray(tasks, points_dir, workers, ray_address, on_row, not resume,
                         {p.key: _task_memory(p.config) for p in todo})
            else:
                run_local(tasks, points_dir, n_workers, on_row, lock.fd)
        finally:
            bar.close()
            release_shared()  # what points run in this process (workers=1) kept
        report.table = write_sweep_table(sweep, folder)
        write_json(folder / "sweep.json", {**sweep.manifest(), "complete": True})
    report.wall_time_s = time.perf_counter() - t0
    return report
