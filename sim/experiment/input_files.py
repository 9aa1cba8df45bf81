"""The files an experiment reads, and their fingerprints (mirrors nothing in vLLM).

A stored result is only as current as its inputs: a resumed sweep that skipped a point because its
*config* had not changed once kept the results of a 7-line trace after the file was cut to 3 lines.
:func:`input_files` lists what a resolved config reads -- the workload's trace file or folder
(its ``path``, else the kind's shared default, ``workloads.paths.default_input``), an Azure arrival
trace, a fitted latency file, model and GPU spec files given as YAML paths -- and
:func:`fingerprint` describes each by **size, modification time and SHA-256 of its content** (every
file of a folder, by relative name). ``sim.experiment.sweep`` stores a point's fingerprint beside
its results (``inputs.json``) and reruns a finished point whose inputs no longer match; ``apcsim
size`` writes it into ``sizing.json``.

Matching compares sizes and content hashes: a file only touched (same bytes, new mtime) still
matches, since the results depend on the bytes; the mtime is recorded for the reader. A missing
input is recorded as missing (the run then fails on it with its own message).

Invariants: a fingerprint is plain JSON data; every file is hashed at most once per
:class:`FingerprintCache`. Imports neither simpy nor torch.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from sim.experiment.config import ExperimentConfig
from workloads.paths import default_input, input_path

_READ = 1 << 20


def input_files(cfg: ExperimentConfig) -> list[Path]:
    """The files and folders ``cfg`` reads (see the module docstring), without duplicates."""
    w = cfg.workload
    found: list[Path] = []
    given = getattr(w, "path", None)
    main = input_path(given, cfg.base_dir) if given else default_input(w.kind, getattr(w, "trace", None))
    if main is not None:
        found.append(main)
    arrival = getattr(w, "arrival", None)
    if arrival is not None and arrival.kind == "azure":
        found.append(input_path(arrival.path, cfg.base_dir) if arrival.path else
                     default_input("azure", arrival.trace))  # type: ignore[arg-type]
    if cfg.latency.kind == "fitted":
        found.append(cfg.resolve_path(cfg.latency.path))
    found += [cfg.resolve_path(name) for name in (cfg.model, cfg.gpu) if name.endswith((".yaml", ".yml"))]
    return list(dict.fromkeys(p.resolve() for p in found if p is not None))


class FingerprintCache:
    """Fingerprints of files already hashed in this process, by (path, size, mtime_ns)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], str] = {}

    def file(self, path: Path) -> dict[str, Any]:
        """``{size, mtime_ns, sha256}`` of one file (``{missing: true}`` when it cannot be read)."""
        try:
            st = os.stat(path)
        except OSError:
            return {"missing": True}
        key = (str(path), st.st_size, st.st_mtime_ns)
        digest = self._known.get(key)
        if digest is None:
            h = hashlib.sha256()
            try:
                with open(path, "rb") as fh:
                    while chunk := fh.read(_READ):
                        h.update(chunk)
            except OSError:
                return {"missing": True}
            digest = self._known[key] = h.hexdigest()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}


def fingerprint(paths: list[Path], cache: FingerprintCache | None = None) -> dict[str, Any]:
    """``{path: file fingerprint}``; a folder maps each file under it (relative name) to its own."""
    cache = cache or FingerprintCache()
    out: dict[str, Any] = {}
    for p in paths:
        if p.is_dir():
            out[str(p)] = {str(f.relative_to(p)): cache.file(f) for f in sorted(p.rglob("*")) if f.is_file()}
        else:
            out[str(p)] = cache.file(p)
    return out


def _content(fp: Any) -> Any:
    """A fingerprint without modification times (what matching compares)."""
    if isinstance(fp, dict):
        return {k: _content(v) for k, v in fp.items() if k != "mtime_ns"}
    return fp


def same_inputs(stored: Any, current: dict[str, Any]) -> bool:
    """Whether a stored fingerprint matches the current one by size and content."""
    return isinstance(stored, dict) and _content(stored) == _content(current)
