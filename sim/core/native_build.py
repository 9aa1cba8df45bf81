"""Which engine modules run compiled: the mypyc group of ``setup.py`` (mirrors nothing in vLLM).

``pip install -e .`` compiles the engine's per-step modules with mypyc from their own ``.py``
source, as one group whose shared library is ``sim._engine__mypyc``; an extension module then
shadows each ``.py``. When the build is missing (no C compiler, a mypyc failure) the same source
runs interpreted: same results, about 1.4-1.6x slower (the full Mooncake replay, results/benchmarks/README.md).
:func:`warn_if_interpreted` says so once per process.

Invariant: compiled or not changes speed only, never a result (the same source; the tests run on
whichever is installed). Compiled, annotations are also enforced at run time: an argument of the
wrong type (a numpy integer for an ``int``) raises TypeError where the interpreter would run on,
so the callers that take outside data (``sim.replay.intake``, the router) convert it first.
Imports nothing from the project, neither simpy nor torch.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache

ENGINE_MODULES = (
    "sim.core.request",
    "sim.core.scheduler",
    "sim.core.kv_cache_manager",
    "sim.core.full_attention_coordinator",
    "sim.core.executor",
    "sim.core.step_price",  # the decode fast-forward's compiled step price
    "sim.replay.step_runner",
    "sim.replay.sync_loop",
    "sim.replay.decode_window",
    "sim.replay.window_gates",  # the decode window's admission gates (split from decode_window)
    "sim.replay.window_apply",
    # the CPU offload tier's per-chunk structures (its policies, their references, the manager):
    # an interpreted class cannot subclass a compiled one, so the references compile too
    "sim.core.offload.policy",
    "sim.core.offload.lru",
    "sim.core.offload.lru_reference",
    "sim.core.offload.arc",
    "sim.core.offload.arc_reference",
    "sim.core.offload.manager",
    # the connector's per-step and per-offer work (build_connector_meta, the store jobs) and its
    # request state: about 9 % fewer instructions of a tiered replay (callgrind, 400 Mooncake requests)
    "sim.core.offload.request_state",
    "sim.core.offload.connector",
    # the tier's scheduler path (admission of the waiting queue, the per-step hooks) and its decode
    # windows: the interpreted remainder of a tiered step
    "sim.core.offload.admission",
    "sim.core.offload.tier",
    "sim.replay.tier_window",
)
"""The modules ``setup.py`` compiles: the one list of the group (``setup.py`` runs this file on its
own to read it, so the module imports nothing beyond the stdlib)."""


def interpreted_engine_modules() -> list[str]:
    """Query: the :data:`ENGINE_MODULES` that were imported from ``.py`` source (all of them
    without the build, none with it)."""
    interpreted = []
    for name in ENGINE_MODULES:
        path = getattr(importlib.import_module(name), "__file__", "") or ""
        if path.endswith(".py"):
            interpreted.append(name)
    return interpreted


@cache
def warn_if_interpreted() -> None:
    """One message on stderr, once per process, when the engine modules run interpreted."""
    interpreted = interpreted_engine_modules()
    if interpreted:
        print(
            f"apcsim: {len(interpreted)} of {len(ENGINE_MODULES)} engine modules are not compiled "
            f"({', '.join(interpreted)}); they run interpreted (same results, slower). Build them "
            "with `pip install -e .` (needs a C compiler).",
            file=sys.stderr,
        )
