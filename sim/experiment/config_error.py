"""The one error type of configuration problems, in a module of its own so that the config models
(``sim.experiment.config``) and the ``--set`` overrides (``sim.experiment.overrides``) share it
without importing each other. Imports only ``sim.core.errors``."""

from __future__ import annotations

from sim.core.errors import ApcsimError


class ConfigError(ApcsimError, ValueError):
    """A configuration problem; ``str()`` is ``file: key: problem``."""
