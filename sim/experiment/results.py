"""Writing a run's results folder (mirrors nothing in vLLM: the simulator's output format).

``results/<name>/`` holds:

* ``requests.parquet`` / ``requests.csv`` -- one row per request (see ``sim.replay.metrics``);
* ``steps.parquet`` / ``steps.csv`` -- one row per engine step;
* ``summary.json`` -- headline metrics (deterministic: same config and seed, same bytes);
* ``config.resolved.yaml`` -- the validated config with every default filled in;
* ``meta.json`` -- git commit, package versions, platform, wall time (differs run to run);
* ``kv_events.jsonl`` -- KV cache events with their step, when ``replay.record_events`` is on;
* ``blocks.parquet`` -- one row per prompt block of every request at its first admission, with its
  miss cause, when ``replay.attribution`` is ``full`` (``sim.replay.attribution_records``; parquet
  only: it has a row per block).

Files are written to a temporary name and renamed, so a folder never holds half a file.

Invariants: a file is complete or absent; ``summary.json`` is deterministic. Imports neither
simpy nor torch.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from sim.core.kv_events import event_to_dict

_PACKAGES = ("apcsim", "numpy", "pandas", "pyarrow", "simpy", "pydantic", "pyyaml", "torch", "matplotlib")


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
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    text = json.dumps(_json_safe(data), indent=2, sort_keys=True) + "\n"
    _atomic_write(path, lambda p: p.write_text(text))


def write_table(out_dir: Path, name: str, df: pd.DataFrame) -> None:
    _atomic_write(out_dir / f"{name}.parquet", lambda p: df.to_parquet(p, index=False))
    _atomic_write(out_dir / f"{name}.csv", lambda p: df.to_csv(p, index=False))


def write_results(
    out_dir: Path,
    *,
    config: dict[str, Any],
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    summary: dict[str, Any],
    meta: dict[str, Any],
    events: list[tuple[int, Any]] | None = None,
    blocks: pd.DataFrame | None = None,
) -> Path:
    """Write every result file of one run into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_table(out_dir, "requests", requests)
    write_table(out_dir, "steps", steps)
    write_json(out_dir / "summary.json", summary)
    text = yaml.safe_dump(config, sort_keys=False)
    _atomic_write(out_dir / "config.resolved.yaml", lambda p: p.write_text(text))
    write_json(out_dir / "meta.json", meta)
    if events:
        lines = "".join(json.dumps({"step": s, **event_to_dict(e)}) + "\n" for s, e in events)
        _atomic_write(out_dir / "kv_events.jsonl", lambda p: p.write_text(lines))
    if blocks is not None:
        _atomic_write(out_dir / "blocks.parquet", lambda p: blocks.to_parquet(p, index=False))
    return out_dir
