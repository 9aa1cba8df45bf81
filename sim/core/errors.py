"""The one base of apcsim's own errors (as SimPy's ``exceptions.py`` gives its errors one base).

Every problem the user can fix -- a bad config key (``ConfigError``, ``sim.experiment.config``), a
bad workload setting (``WorkloadConfigError``, ``workloads.errors``), a bad trace line
(``TraceFormatError``, ``workloads.trace_format``), a replay that cannot go on (``ReplayError``,
``sim.replay.engine``) -- subclasses :class:`ApcsimError`, so that the command line catches one
type and prints its message on one line. Those subclasses keep their historical built-in base too
(``ValueError`` or ``RuntimeError``), so ``except ValueError`` callers still catch them. A broken
internal invariant is not an ``ApcsimError``: it raises ``AssertionError`` from ``check_integrity``.

Invariants: the message of an ``ApcsimError`` is complete on its own (file, line or key, problem).
Imports nothing.
"""


class ApcsimError(Exception):
    """An error the user can act on; ``str()`` is the whole message."""
