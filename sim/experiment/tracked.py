"""Committed reference results are not a user's scratch space: a study or sweep refuses to write into
a folder that holds files tracked by git unless ``--force`` says so (mirrors nothing in vLLM).

``apcsim sidechannel configs/sidechannel.yaml`` writes ``results/sidechannel/``, the folder the
docs' tables come from; run in a checkout, it would rewrite the committed tables and figures.
:func:`refuse_tracked` is called by ``apcsim sweep`` and ``apcsim sidechannel`` before anything
runs: a folder with tracked files raises ``ConfigError`` naming it and the two ways out
(``--output-dir DIR`` or ``--set output_dir=DIR``, or ``--force`` to update the reference).

Invariants: outside a git work tree, or without git, nothing is tracked and nothing is refused;
the check only reads (``git ls-files``). Imports neither simpy nor torch.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from sim.experiment.config_error import ConfigError


def tracked_files(folder: Path) -> int:
    """How many files under ``folder`` git tracks (0 outside a work tree or without git)."""
    folder = folder.expanduser().absolute()
    where = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
    if where is None or not folder.exists():
        return 0
    try:
        out = subprocess.run(["git", "ls-files", "--", str(folder)], cwd=where, capture_output=True, text=True,
                             timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len(out.splitlines())


def refuse_tracked(folder: Path, force: bool, what: str) -> None:
    """Raise ``ConfigError`` when ``folder`` holds committed files and ``force`` is off."""
    n = 0 if force else tracked_files(folder)
    if n:
        raise ConfigError(
            f"{folder}: holds {n} files committed to the repository (reference results); this {what} would "
            f"write over them -- choose another folder with --output-dir DIR (or --set output_dir=DIR), "
            f"or pass --force to update the reference")
