"""Reading and preparing output folders outside ``apcsim run``'s atomic writer (mirrors nothing in
vLLM): :func:`writable_folder` checks a command's output folder before any work (``apcsim size``'s
``sizing.json``), :func:`reading_results` turns a damaged or foreign table into one
:class:`~sim.experiment.results_folder.ResultsError` (``apcsim explain``, ``apcsim plot``).

Invariants: every problem is a ``ResultsError`` naming the folder. Imports neither simpy nor torch
(pyarrow and pandas errors are recognised by their module, not imported).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.core.errors import ApcsimError
from sim.experiment.results_folder import ResultsError, not_a_file, os_problem


def writable_folder(folder: str | Path, files: tuple[str, ...] = (), option: str = "--out") -> Path:
    """``folder`` created now (with its parents) and checked writable, before any work is done, so
    that a command writing a few files into it (``apcsim size``: ``sizing.json``) fails in a second,
    not after its replays; each of ``files`` already there must be a regular file. Problems raise
    :class:`ResultsError` naming the folder and ``option``."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ResultsError(f"{folder}: exists and is not a folder; remove it or pick another {option}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ResultsError(f"{folder}: cannot create the folder: {os_problem(exc)}; pick another {option}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ResultsError(f"{folder}: cannot write results here: {os.strerror(errno.EACCES)}; pick another {option}")
    for name in files:
        if os.path.lexists(folder / name) and (kind := not_a_file(folder / name)):
            raise ResultsError(f"{folder / name}: is {kind}, where apcsim writes a result file; move it or pick "
                               f"another {option}")
    return folder


@contextmanager
def reading_results(folder: str | Path) -> Iterator[None]:
    """Around code that reads a results or sweep folder's tables: a damaged or foreign table --
    pyarrow's ``ArrowInvalid``, a pandas parser error, a missing column (``KeyError: 'block'``), an
    unreadable file -- becomes one :class:`ResultsError` naming the folder, not a traceback."""
    try:
        yield
    except ApcsimError:
        raise
    except KeyError as exc:
        raise ResultsError(f"{folder}: a table lacks the column {exc.args[0]!r}: not results of this apcsim, or "
                           f"damaged; rerun the command that wrote it") from None
    except (OSError, ValueError) as exc:
        if not isinstance(exc, OSError) and not type(exc).__module__.startswith(("pyarrow", "pandas")):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ResultsError(f"{folder}: cannot read its tables ({first}); damaged? rerun the command that "
                           f"wrote it") from None
