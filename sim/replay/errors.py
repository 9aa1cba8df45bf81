"""The replay's error (raised by ``sim.replay``; the CLI prints it as one line).

Mirrors nothing in vLLM: vLLM rejects a too-long prompt at request intake and never stalls, the
simulator reports both instead of hanging. Imports only the error base of sim.core.
"""

from __future__ import annotations

from sim.core.errors import ApcsimError


class ReplayError(ApcsimError, RuntimeError):
    """The replay cannot continue (bad request, stalled engine)."""
