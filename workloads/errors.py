"""Workloads' errors (mirrors nothing in vLLM): a bad ``workload:`` setting
(:class:`WorkloadConfigError`), and the bad-input policy shared by every loader: stop with file,
line and field, or skip and count.

A setting that passes the schema (``workloads.schema``) but fails once the workload is built (a
missing trace file, ``arrival.kind: trace`` on a source without timestamps) raises
``WorkloadConfigError(key, problem)``, with ``key`` relative to the ``workload:`` section;
``sim.experiment`` turns it into its ``ConfigError`` naming the config file
(``x.yaml: workload.path: no such file ...``).

Every loader takes ``skip_bad_lines``. Without it, the first bad record raises
:class:`~workloads.trace_format.TraceFormatError` (``file:line: field 'x': problem``). With it, the
loader calls :meth:`SkipLog.skip` instead and continues; the log keeps the total count, the first
:data:`MAX_KEPT` locations and the first message, and ``sim.experiment.run`` writes them to ``meta.json``
(``skipped_bad_lines`` / ``skipped_line_numbers``). Nothing is dropped without being counted.

Invariants: every error is an ``ApcsimError``; nothing skipped goes uncounted. Imports sim.core
only (neither simpy nor torch).
"""

from __future__ import annotations

from sim.core.errors import ApcsimError
from workloads.trace_format import MAX_SKIPPED_LINES_KEPT, TraceFormatError

MAX_KEPT = MAX_SKIPPED_LINES_KEPT


class WorkloadConfigError(ApcsimError, ValueError):
    """A ``workload:`` setting that cannot be built; ``str()`` is ``workload.<key>: <problem>``."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"workload.{key}: {problem}")

    def __reduce__(self) -> tuple[type[WorkloadConfigError], tuple[str, str]]:
        return (type(self), (self.key, self.problem))


class SkipLog:
    """What a loader skipped. ``skipped_lines`` holds ints (line numbers of a one-file trace) or
    ``"file:line"`` strings (multi-file traces)."""

    def __init__(self, *, with_file: bool = False) -> None:
        self.with_file = with_file
        self.skipped = 0
        self.skipped_lines: list[int | str] = []
        self.first_error: str | None = None

    def skip(self, err: TraceFormatError) -> None:
        """Count ``err`` as one skipped record."""
        self.skipped += 1
        if self.first_error is None:
            self.first_error = str(err)
        if len(self.skipped_lines) < MAX_KEPT:
            from pathlib import Path

            self.skipped_lines.append(f"{Path(err.path).name}:{err.line}" if self.with_file else err.line)

    def handle(self, err: TraceFormatError, skip_bad_lines: bool) -> None:
        """Raise ``err`` unless skipping; then count it."""
        if not skip_bad_lines:
            raise err
        self.skip(err)

    def refuse_empty(self, path: str, lineno: int, skipped_before: int, allow_empty: bool, where: str = "") -> None:
        """For a loader that yielded no request: raise ``TraceFormatError`` at ``lineno`` (its last
        line, at least 1) for an empty trace (``where`` ends that message), or for one whose every
        line was skipped unless ``allow_empty``. ``skipped_before`` is :attr:`skipped` when the
        load began (one log may count several loads)."""
        skipped = self.skipped - skipped_before
        if not skipped:
            raise TraceFormatError(path, max(lineno, 1), None, f"empty trace: no request lines{where}")
        if not allow_empty:
            raise TraceFormatError(path, max(lineno, 1), None, f"every line was skipped as bad ({skipped} lines); "
                                                               "set allow_empty: true to replay no requests")

    def __repr__(self) -> str:
        return f"SkipLog(skipped={self.skipped})"
