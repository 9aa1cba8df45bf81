"""The guards that keep the layers honest, as ordinary tests (CI runs only ``pytest``).

* ``lint-imports``: every import contract of ``[tool.importlinter]`` in pyproject.toml (layers,
  no gpu_backend / torch / simpy leaks, acyclic siblings);
* ``ruff check .`` with ``[tool.ruff]``;
* ``mypy`` with ``[tool.mypy]`` (its ``files``);
* module size: every module of sim/, workloads/ and gpu_backend/ under ``MAX_LINES`` physical lines,
  and their median under ``MAX_MEDIAN`` (package ``__init__`` files count for the limit, not for
  the median). Cython sources count as modules too: a ``.pyx`` file and each ``.pxi`` piece it
  includes (``SOURCE_SUFFIXES``).

Each tool runs in a subprocess of this interpreter, from the repository root, with the root first
on ``PYTHONPATH`` (so the checked code is this checkout, whatever an editable install points at)
and with its caches off or in the temporary directory (nothing is written into the checkout). A
failure shows the tool's own report. The tools come with the ``test`` extra
(``pip install -e ".[test]"``); a missing one fails, naming the extra.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "workloads", "gpu_backend")
MAX_LINES = 400  # every module strictly under this
MAX_MEDIAN = 200  # the median module strictly under this
SOURCE_SUFFIXES = (".py", ".pyx", ".pxi")  # hand-written sources; generated .c files are ignored by git
_REPORT_CHARS = 12_000


def _tool(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` from the repository root, with this checkout first on the path."""
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: it comes with the test extra (pip install -e '.[test]')")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _check(res: subprocess.CompletedProcess[str], what: str) -> None:
    """Fail with the tool's own report (its last ``_REPORT_CHARS`` characters) unless it exited 0."""
    if res.returncode == 0:
        return
    out = (res.stdout + res.stderr).strip()
    if len(out) > _REPORT_CHARS:
        out = "...\n" + out[-_REPORT_CHARS:]
    pytest.fail(f"{what}: exit status {res.returncode}\n{out}", pytrace=False)


def test_import_contracts_are_kept() -> None:
    """Every contract of [tool.importlinter]: layers import downward only, and the rest."""
    res = _tool("importlinter", "-c", "import sys; from importlinter.cli import lint_imports_command; "
                "sys.exit(lint_imports_command())", "--no-cache", "--no-logo")
    _check(res, "lint-imports: broken import contracts")


def test_ruff_is_clean() -> None:
    res = _tool("ruff", "-m", "ruff", "check", ".", "--no-cache", "--output-format", "concise")
    _check(res, "ruff check .")


def test_mypy_is_clean() -> None:
    # a cache per checkout in the temporary directory: a cold run takes ~30 s (torch's stubs), a warm one ~2 s
    cache = Path(tempfile.gettempdir()) / f"apcsim-mypy-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}"
    res = _tool("mypy", "-m", "mypy", "--cache-dir", str(cache), "--hide-error-context")
    _check(res, "mypy (files and options from pyproject.toml)")


def _module_sizes() -> dict[str, int]:
    sizes = {}
    for package in PACKAGES:
        for path in sorted(p for p in (ROOT / package).rglob("*") if p.suffix in SOURCE_SUFFIXES):
            with open(path, "rb") as f:
                sizes[str(path.relative_to(ROOT))] = sum(1 for _ in f)  # physical lines, as wc -l counts them
    return sizes


def test_every_module_is_under_the_size_limit() -> None:
    sizes = _module_sizes()
    assert len(sizes) > 50, f"found only {len(sizes)} modules under {PACKAGES}: wrong root {ROOT}?"
    offenders = sorted(((n, p) for p, n in sizes.items() if n >= MAX_LINES), reverse=True)
    if offenders:
        report = "\n".join(f"  {p}: {n} lines" for n, p in offenders)
        print(report)
        pytest.fail(f"modules of {MAX_LINES} lines or more (split them, one concept per file):\n{report}",
                    pytrace=False)


def test_median_module_is_small() -> None:
    sizes = {p: n for p, n in _module_sizes().items() if not p.endswith("__init__.py")}
    median = statistics.median(sizes.values())
    largest = sorted(((n, p) for p, n in sizes.items()), reverse=True)[:10]
    print(f"median module: {median} lines over {len(sizes)} modules; largest: {largest}")
    if not median < MAX_MEDIAN:
        report = "\n".join(f"  {p}: {n} lines" for n, p in largest)
        pytest.fail(f"median module size {median} lines (limit {MAX_MEDIAN}); the largest:\n{report}", pytrace=False)
