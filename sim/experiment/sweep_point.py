"""Running one sweep point and storing its result atomically under ``points/<key>/`` (mirrors
nothing in vLLM).

:func:`compute_point` replays one point's config and computes its offline bounds; it returns the
point's row (derived config facts, every summary metric, bounds, status, wall times) and its files
as bytes, so that it can run anywhere (a local worker process or a Ray task on another machine).
:func:`commit_point` writes those files into ``points/.tmp-<key>-<random>/`` and renames the folder
to ``points/<key>/`` in one step: a point folder is complete or absent, never half written. A point
that raises is stored the same way with ``status: error``, its message in the row and the traceback
in ``error.txt``.

``points/<key>/`` holds ``row.json``, ``summary.json``, ``config.resolved.yaml``, ``meta.json``,
``inputs.json`` (the fingerprint of the files the point read, when it read any) and
``requests.parquet`` (plus ``steps.parquet`` with the sweep's ``keep_steps: true``; the tables of
``apcsim run``, parquet only), or ``row.json`` and ``error.txt`` for a failed point.

Every row's engine facts (``block_size`` -- the scheduler block size --, ``num_gpu_blocks``,
``kv_pool_gib``, ``capacity_tokens``) and its bounds come from the point's resolved engine
(:func:`sim.experiment.engine_description.resolve`), so a sliding-window or hybrid model reports
its own group sizes, never ``engine.block_size``. A point with a CPU offload tier also carries its
resolved size (``num_cpu_chunks``, ``cpu_tier_gib``, ``cpu_tier_capacity_tokens``,
``cpu_tier_policy``: :func:`sim.experiment.tier_axis.tier_facts`); an untiered row has none of them.

Offline bounds (``workloads.bounds``), request-level (compare with ``request_hit_rate``), over the
point's own request stream at its scheduler block size: ``infinite_cache_hit_rate`` always (an
upper bound for one full-attention group, a sliding window and full + sliding-window hybrids
alike); ``belady_hit_rate`` and ``lru_sequential_hit_rate`` at capacity ``num_gpu_blocks - 1``
only when the pool holds one full-attention group, NaN otherwise: their model is one pool of
equal blocks, which several groups competing for the pool, or a window freeing blocks, break.
They are computed by :func:`sim.experiment.bounds.run_references` (a cluster point gets only the
fleet-wide infinite cache, as ``apcsim run`` does), which caches the block reference string of a
stream in the worker process, so points that differ only in pool capacity hash their stream once.

A worker builds each stream once (:func:`sim.experiment.workload.shared_workload`: the points of a
sweep that differ only in engine settings replay the same requests), and the replay and the bounds
of a point read that one materialised stream.

A config with a ``sidechannel:`` section is computed by ``sim.experiment.sidechannel.point`` (the
background workload and the side-channel parties in one replay): its attack columns join the
row, ``probes.parquet`` replaces ``requests.parquet``, and no bounds are computed.

Invariants: a point folder is complete or absent, never half written; every column but
:data:`WALL_COLUMNS` is deterministic. Imports simpy only inside :func:`compute_point` (through
``sim.experiment.run``), never torch.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import yaml

from sim.experiment.engine_description import EngineDescription, resolve
from sim.experiment.results import _json_safe, run_metadata
from sim.experiment.results_folder import is_complete
from sim.experiment.tier_axis import tier_facts

ROW_FILE = "row.json"
INPUTS_FILE = "inputs.json"
WALL_COLUMNS = ("wall_time_s", "bounds_wall_time_s", "worker", "worker_peak_rss_mib")
"""Columns that differ from run to run (everything else in a row is deterministic): the point's wall
times, the worker that ran it (``host:pid``) and that worker process's peak RSS so far (MiB)."""


def _flatten(prefix: str, data: dict[str, Any], out: dict[str, Any]) -> None:
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(f"{name}.", v, out)
        elif isinstance(v, list):  # e.g. a cluster's per-replica rows: one JSON cell
            out[name] = json.dumps(_json_safe(v), sort_keys=True)
        else:
            out[name] = v


def derived_facts(cfg: Any, engine: EngineDescription) -> dict[str, Any]:
    """Config facts every row carries whatever was swept (resolved pool size, capacity, ...)."""
    w = cfg.workload
    tenants = getattr(w, "tenants", None)
    return {
        "workload_kind": w.kind,
        "model": cfg.model,
        "gpu": cfg.gpu,
        "seed": cfg.seed,
        "block_size": engine.block_size,
        "num_gpu_blocks": engine.num_gpu_blocks,
        "kv_pool_gib": engine.kv_pool_gib,
        "capacity_tokens": engine.capacity_tokens,
        "salt_policy": tenants.salt if tenants is not None else None,
        "num_tenants": tenants.num_tenants if tenants is not None else None,
        **tier_facts(engine),  # a CPU tier's size (num_cpu_chunks, cpu_tier_gib, ...); nothing without one
    }


def _worker_facts() -> dict[str, Any]:
    import socket

    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except ImportError:  # pragma: no cover
        rss = float("nan")
    return {"worker": f"{socket.gethostname()}:{os.getpid()}", "worker_peak_rss_mib": round(rss, 1)}


def _parquet(df: Any) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(_json_safe(data), indent=2, sort_keys=True) + "\n").encode()


def compute_point(task: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Run one point; returns ``(row, files)``. Never raises for a failing point."""
    from sim.experiment.config import config_from_dict, config_to_dict

    t0 = time.perf_counter()
    row: dict[str, Any] = {"key": task["key"]}
    try:
        data = dict(task["config"])
        data.setdefault("replay", {})
        data["replay"] = {**data["replay"], "progress": False}
        cfg = config_from_dict(data, task.get("source", "<sweep>"), task.get("base_dir", "."))
        from sim.experiment.run import replay_experiment

        engine = resolve(cfg)
        facts = derived_facts(cfg, engine)
        extra_files: dict[str, bytes] = {}
        side: dict[str, Any] = {}
        scope = str(task.get("run", task["key"]))  # the sweep run sharing streams (a bare task: the point alone)
        given = None
        if cfg.sidechannel is not None:  # background + side-channel parties (sim.experiment.sidechannel.point)
            from sim.experiment.sidechannel.point import run_point

            sc = run_point(cfg, engine)
            result, workload, side, extra_files = sc.replay, sc.workload, sc.metrics, sc.files
        else:  # one engine replays the worker's shared stream (a fleet builds its own)
            from sim.experiment.workload import shared_workload

            given = shared_workload(cfg, engine, scope=scope) if cfg.cluster is None else None
            result, workload = replay_experiment(cfg, progress=False, engine=engine, workload=given)
        wall = time.perf_counter() - t0
        metrics: dict[str, Any] = {}
        _flatten("", result.summary, metrics)
        row.update(facts)
        row.update(metrics)
        row.update(side)
        tb = time.perf_counter()
        if task.get("bounds", True) and cfg.sidechannel is None:  # bounds of a side-channel point: not computed
            from sim.experiment.bounds import run_references

            row.update(run_references(cfg, engine, (workload.requests, scope) if given is not None else None))
        row.update(status="ok", error=None, wall_time_s=wall, bounds_wall_time_s=time.perf_counter() - tb,
                   **_worker_facts())
        extra: dict[str, Any] = {"workload": workload.description, "sweep_point_key": task["key"]}
        files = {  # a side-channel point keeps its probes (below), not thousands of background requests
            **({} if cfg.sidechannel is not None else {"requests.parquet": _parquet(result.requests)}),
            "summary.json": _json_bytes(result.summary),
            "config.resolved.yaml": yaml.safe_dump(config_to_dict(cfg), sort_keys=False).encode(),
            "meta.json": _json_bytes({**run_metadata(result.wall_time_s, extra), "complete": True}),
        }
        if task.get("keep_steps"):
            files["steps.parquet"] = _parquet(result.steps)
        if task.get("inputs"):  # the input files' fingerprint, checked before a resume skips the point
            files[INPUTS_FILE] = _json_bytes(task["inputs"])
        files.update(extra_files)
    except Exception as exc:  # a failing point is recorded, never fatal to the sweep
        return error_result(task["key"], exc, time.perf_counter() - t0)
    files[ROW_FILE] = _json_bytes(row)
    return row, files


def error_result(
    key: str, exc: BaseException, wall: float = 0.0, *, worker: bool = True
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The row and files of a failed point."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    row: dict[str, Any] = {"key": key, "status": "error",
                           "error": f"{type(exc).__name__}: {first}" if first else type(exc).__name__,
                           "wall_time_s": wall, "bounds_wall_time_s": 0.0}
    if worker:
        row.update(_worker_facts())
    tb = "".join(traceback.format_exception(exc))
    files = {"error.txt": f"{type(exc).__name__}: {exc}\n\n{tb}".encode(), ROW_FILE: _json_bytes(row)}
    return row, files


def read_row(folder: Path) -> dict[str, Any] | None:
    """A committed point's row, or None when the folder holds none -- or holds an ``ok`` row without
    the ``complete: true`` marker in its ``meta.json`` (an older apcsim, or a folder copied half):
    such a point runs again."""
    try:
        row = json.loads((folder / ROW_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict):
        return None
    if row.get("status") == "ok" and not is_complete(folder):
        return None
    return row


def read_inputs(folder: Path) -> dict[str, Any]:
    """The input fingerprint stored with a point (``sim.experiment.input_files``); {} when none
    (a point that reads no file, or one stored by an older apcsim)."""
    try:
        data = json.loads((folder / INPUTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def commit_point(points_dir: Path, key: str, files: dict[str, bytes], *, replace: bool = False) -> Path:
    """Write ``files`` as ``points_dir/<key>/`` atomically (temp folder + rename).

    A finished (``ok``) folder already there is kept and the new files are dropped, so a point is
    never stored twice, unless ``replace`` (``--no-resume``); an ``error`` folder is replaced."""
    points_dir.mkdir(parents=True, exist_ok=True)
    final = points_dir / key
    tmp = points_dir / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, blob in files.items():
            (tmp / name).write_bytes(blob)
        try:
            os.rename(tmp, final)
            return final
        except OSError:  # the target exists (a retried error, or another writer got there first)
            old = read_row(final)
            if old is not None and old.get("status") == "ok" and not replace:
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            trash = points_dir / f".trash-{key}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            os.rename(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
            return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run_and_commit(task: dict[str, Any], points_dir: str) -> dict[str, Any]:
    """Worker entry point of the local pool: compute, then commit from the worker itself (so a
    finished point survives the death of the driver)."""
    row, files = compute_point(task)
    commit_point(Path(points_dir), task["key"], files, replace=bool(task.get("replace")))
    return row
