"""A benchmark's figures kept as a results folder (``--out DIR`` of the benchmark scripts).

The folder is written like an ``apcsim run``'s (``sim.experiment.results_folder``): opened, checked
and locked before the benchmark runs, so that an unwritable place fails at once; filled in a private
temporary folder; ``meta.json`` written last with ``complete: true``; then swapped in whole. A
folder holding files the benchmark does not write is refused, never replaced.

``meta.json`` carries what the figures depend on beyond the code: the commit, package versions,
CPU model and count, and the load average before and after (the benchmarks measure time, so a busy
host shows there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class BenchFolder:
    """The results folder of one benchmark run; :meth:`write` fills and swaps it in."""

    def __init__(self, out: str | Path, allowed: Callable[[str], bool]) -> None:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from sim.experiment.results_folder import ResultsFolder

        self._folder = ResultsFolder(out, allowed=lambda name: name == "meta.json" or allowed(name)).open()
        self._t0 = time.perf_counter()
        self.load_before = os.getloadavg()

    def write(self, files: dict[str, Any], meta: dict[str, Any]) -> Path:
        """Write ``files`` (a ``str`` as text, anything else as JSON) and ``meta.json`` last, then
        swap the folder in; returns its path."""
        from sim.experiment.results import fill_and_commit, run_metadata, write_json

        def write_files(tmp: Path) -> None:
            for name, content in files.items():
                if isinstance(content, str):
                    (tmp / name).write_text(content)
                else:
                    write_json(tmp / name, content)

        full = run_metadata(time.perf_counter() - self._t0, {
            **meta, "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
            "load_average_before": list(self.load_before), "load_average_after": list(os.getloadavg()),
        })
        return fill_and_commit(self._folder, full, write_files)

    def close(self) -> None:
        """Drop the temporary folder if nothing was committed; release the lock."""
        self._folder.close()


def open_bench_folder(out: str | None, allowed: Callable[[str], bool]) -> BenchFolder | None:
    """A :class:`BenchFolder` for ``--out`` (None without one)."""
    return BenchFolder(out, allowed) if out else None


def run_with_folder(
    out: str | None, allowed: Callable[[str], bool], bench: Callable[[BenchFolder | None], None]
) -> None:
    """Open the ``--out`` folder before the benchmark runs (an unwritable place fails now, not after
    the runs), run ``bench(folder)``, release the folder whatever happens."""
    folder = open_bench_folder(out, allowed)
    try:
        bench(folder)
    finally:
        if folder is not None:
            folder.close()


def compile_bytecode(root: Path = ROOT) -> None:
    """Write the bytecode of the project's packages before the timed runs, as installing a package
    does: an interpreter started with ``PYTHONDONTWRITEBYTECODE`` (this project's sandboxes set it)
    never writes it, so every timed process would compile each edited module again -- about 0.1 s
    of CPU per run here, which is not the simulator's work. ``root``: another checkout's packages."""
    import compileall

    for pkg in ("sim", "workloads"):
        compileall.compile_dir(str(root / pkg), quiet=1)


def bench_trees(other: str | None) -> list[tuple[str, Path]]:
    """The checkouts a benchmark times alternately: ``("this", ROOT)`` and, given ``--tree DIR``,
    ``("tree", DIR)``; each one's bytecode is written first (:func:`compile_bytecode`)."""
    trees = [("this", ROOT)] + ([("tree", Path(other).resolve())] if other else [])
    for _, root in trees:
        compile_bytecode(root)
    return trees


def child_json(cmd: list[str], root: Path | None = None, cwd: Path | None = None) -> dict[str, Any]:
    """Runs one timed child process (a benchmark script's ``--child`` mode) and returns the JSON
    object it printed on its last line. ``root``: run on that checkout's packages (``PYTHONPATH``);
    None, on this environment's. A failing child raises ``CalledProcessError``."""
    env = {**os.environ, "PYTHONPATH": str(root)} if root is not None else None
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=cwd).stdout
    row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return row


def markdown_table(keys: list[str], rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``rows``: one column per key, ``str`` of each value."""
    table = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    return table + "".join("| " + " | ".join(str(r[k]) for k in keys) + " |\n" for r in rows)


def cpu_model() -> str | None:
    """The first ``model name`` of ``/proc/cpuinfo`` (None elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
