"""The replay's error (raised by ``sim.replay``; the CLI prints it as one line).

Mirrors nothing in vLLM: vLLM rejects a too-long prompt at request intake and never stalls, the
simulator reports both instead of hanging. Imports nothing.
"""

from __future__ import annotations


class ReplayError(RuntimeError):
    """The replay cannot continue (bad request, stalled engine)."""
