"""Where the project's read-only shared inputs live, and how a config's input path resolves
(mirrors nothing in vLLM).

Invariants: an input path is absolute, or relative to the folder of the config that names it
(never to the working directory). Imports nothing from sim.
"""

from __future__ import annotations

from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    """The shared public traces: ``<repo>/../shared/traces`` (no environment variable involved)."""
    return _REPO_ROOT.parent / "shared" / "traces"


def input_path(p: str, base_dir: str | Path) -> Path:
    """An input path: ``p`` (``~`` expanded) if absolute, else ``base_dir / p``."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else (Path(base_dir) / path)
