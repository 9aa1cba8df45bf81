"""The command line's parsing and error lines (mirrors nothing in vLLM): typed numbers, one
``apcsim: error:`` line for argparse's own errors, the OS errors of a path, a closed stdout.

Every number a command takes is checked when the arguments are parsed, before anything runs.

``--max-replicas -5`` once printed ``round_robin > -5`` and wrote ``sizing.json``; now each number
option names its range in its ``type``: :func:`int_at_least` builds the parser of an int with a
lower bound, :func:`int_list` of a comma-separated list of them. A bad value is argparse's
``invalid value`` error naming the option (exit code 2).

:class:`Parser` is the CLI's ``ArgumentParser`` (sub-commands inherit it): a usage error is one line,
``apcsim: error: size: argument --max-replicas: must be ...`` (exit code 2), not argparse's usage
block and ``apcsim size: error:``. :func:`os_error_line` words an ``OSError`` as ``path: problem``;
:func:`quiet_broken_pipe` ends a command whose reader went away without a traceback.

Invariants: the parsers return plain ints; their messages name the bound and the value given.
Imports only the stdlib.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

SIGPIPE_EXIT = 141
"""Exit code of a command whose stdout was closed (128 + SIGPIPE, as a shell reports git's)."""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one ``apcsim: error:`` line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        text = " ".join(message.split())  # argparse's messages may wrap; a value cannot break the line
        self.exit(2, f"apcsim: error: {command + ': ' if command else ''}{text} (see {self.prog} --help)\n")


def os_error_line(exc: OSError) -> str:
    """``path: problem`` for an OSError (``no such file`` for a missing one)."""
    problem = "no such file" if isinstance(exc, FileNotFoundError) else (exc.strerror or str(exc))
    return f"{exc.filename}: {problem}" if exc.filename else problem


def quiet_broken_pipe() -> int:
    """After a ``BrokenPipeError`` on stdout: point stdout at ``/dev/null`` (so the interpreter's
    final flush cannot fail again) and return :data:`SIGPIPE_EXIT`."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture): nothing to redirect
        pass
    return SIGPIPE_EXIT


def json_number(value: Any) -> Any:
    """``value`` for a strict JSON document: a non-finite float becomes null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def int_at_least(minimum: int, *, maximum: int | None = None) -> Callable[[str], int]:
    """A parser of an int in ``[minimum, maximum]`` for ``add_argument(type=...)``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"  # argparse names the type in some messages
    return parse


def float_in(low: float, high: float | None = None, *, low_open: bool = True,
             high_open: bool = True) -> Callable[[str], float]:
    """A parser of a finite float in the interval from ``low`` to ``high`` (each end open unless
    told; ``high=None``: no upper end) for ``add_argument(type=...)``."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value <= low if low_open else value < low
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            lo = f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f" and {'<' if high_open else '<='} {high:g}"
            raise argparse.ArgumentTypeError(f"must be {lo}{hi}, got {text.strip()}")
        return value

    parse.__name__ = "number"
    return parse


def int_list(minimum: int) -> Callable[[str], list[int]]:
    """A parser of ``16,32,64`` (each ``>= minimum``) for ``add_argument(type=...)``."""
    one = int_at_least(minimum)

    def parse(text: str) -> list[int]:
        values = [one(part) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
        return values

    return parse


def blame_overrides(message: str, args: argparse.Namespace) -> str:
    """An error message whose ``CONFIG: key: problem`` lines name the ``--set`` override that set
    the key instead (``sim.experiment.overrides.blame_override``), also for errors raised after the
    config was loaded (the engine's resolution, a replay)."""
    source, overrides = getattr(args, "config", None), getattr(args, "set", None)
    if not source or not overrides or not isinstance(overrides, list):
        return message
    from sim.experiment.overrides import blame_override

    return "\n".join(blame_override(line, str(source), overrides) for line in message.splitlines())


MAX_POINTS_WITHOUT_YES = 1000
"""A sweep or study with more points than this runs only with ``--yes``."""


def announce_points(what: str, name: str, points: list[Any], folder: Any, yes: bool) -> str:
    """The line a sweep (or study) starts with -- its point count, the distinct configs among them and,
    when every point's workload says its size, the requests it will replay -- or a ``ConfigError``
    above :data:`MAX_POINTS_WITHOUT_YES` points without ``yes``: 10,000 points never start unannounced."""
    from sim.experiment.config import ConfigError

    distinct = len({p.key for p in points})
    sizes: list[int] = [getattr(p.config.workload, "num_requests", None) or getattr(p.config.workload, "limit", None)
                        or 0 for p in points]
    facts = [f"{distinct:,} distinct configs"] if distinct != len(points) else []
    facts += [f"about {sum(sizes):,} requests to replay"] if sizes and all(sizes) else []
    count = f"{len(points):,} point{'' if len(points) == 1 else 's'}" + (f" ({', '.join(facts)})" if facts else "")
    if len(points) > MAX_POINTS_WITHOUT_YES and not yes:
        raise ConfigError(f"{what} {name}: {count}, more than {MAX_POINTS_WITHOUT_YES:,}: add --yes to run them all "
                          f"(finished points are kept)")
    return f"{what} {name}: {count} -> {folder}/"
