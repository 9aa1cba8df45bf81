"""Where the project's read-only shared inputs live."""

from __future__ import annotations

from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def repo_root() -> Path:
    """The project's repository root (the folder holding ``workloads/``)."""
    return _REPO_ROOT


def shared_traces_dir() -> Path:
    """The shared public traces: ``<repo>/../shared/traces`` (no environment variable involved)."""
    return _REPO_ROOT.parent / "shared" / "traces"
