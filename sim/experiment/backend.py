"""Execution backends by name (mirrors vLLM's executor chosen by ``distributed_executor_backend``
name): a registry of ``name -> "module:function"`` entries, each imported
only when it is chosen (mini-sglang's name registry with lazy imports; BLIS's implementations
registering into an interface owned above them).

The interface is :class:`sim.core.executor.Executor`, built per run by an
:data:`~sim.experiment.run.ExecutorFactory` ``(cfg, scheduler) -> Executor``. ``sim`` is the
simulated executor (the latency model); ``torch`` runs real forward passes
(``gpu_backend.executor.factory.make_torch_executor``). :func:`load_entry` also serves the command line's
registry of ``gpu_backend`` commands (``sim.cli.calibrate``).

Invariants: no entry is imported before it is asked for, so neither ``sim`` nor a simulated run
imports ``gpu_backend`` or torch; a missing optional dependency of an entry becomes one
:class:`~sim.experiment.config.ConfigError` line. Imports neither simpy, torch nor gpu_backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sim.experiment.config import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sim.experiment.run import ExecutorFactory

EXECUTORS: dict[str, str] = {
    "sim": "sim.experiment.run:simulated_executor",
    "torch": "gpu_backend.executor.factory:make_torch_executor",
}
"""Executor factories by backend name (``apcsim run --backend NAME``)."""


def load_entry(entry: str) -> Any:
    """The object ``module:attribute`` names, importing its module now (ImportError propagates)."""
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


def executor_factory(name: str) -> ExecutorFactory:
    """The executor factory registered as ``name``; an unknown name or a missing dependency
    raises ``ConfigError``."""
    try:
        entry = EXECUTORS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(EXECUTORS)}") from None
    try:
        factory: ExecutorFactory = load_entry(entry)
    except ImportError as exc:
        raise ConfigError(
            f"--backend {name} needs PyTorch ({exc}); install it with pip install -e '.[torch]'"
        ) from None
    return factory
