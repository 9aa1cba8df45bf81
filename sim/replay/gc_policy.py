"""How a replay runs CPython's cyclic garbage collector.

A replay makes few reference cycles (SimPy's processes and their events) but a great many
short-lived containers -- a step's scheduled list, a window's rows, a request's block lists -- and
CPython runs a first-generation pass every 700 net container allocations by default, each also
walking whatever survived earlier passes. So while a replay's clock runs -- one engine's
(``sim.replay.engine.Replay``) or a fleet's (``sim.cluster.cluster.ClusterReplay``, whose router
indexes and sixteen replicas' tables would otherwise be walked again and again: about 30 % of a
16-replica run's CPU by ``perf``, before the fleet used this policy too):

* what existed before it (modules, configs, the loaded workload) is frozen out of every pass
  (``gc.freeze``), and
* a first-generation pass runs every ``REPLAY_GC_THRESHOLD`` net allocations instead; the cycles
  a replay does make are still collected, only later.

Both are restored when the replay ends, however it ends, and one pass over the two young
generations then moves what the replay made and still holds to the oldest generation: at the raised
threshold few passes ran, so its survivors -- a fleet's engines, tables and router index, about a
million objects -- are all young, and the default policy would walk them twice while the result is
built (a first-generation pass at the next 700 allocations, a second-generation one ten passes
later): gc callbacks on the Dynamo 16-replica child (first 2,000 Mooncake requests), GC time after
the clock stops 0.033 -> 0.015 s. (``gc.freeze`` + ``gc.unfreeze`` would move them without a walk,
but uncounted: the full collections that free a dead fleet's cycles would come later and later in a
process that replays many times.) Imports only the standard library.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

REPLAY_GC_THRESHOLD = 50_000
"""First-generation threshold of the cyclic GC while a replay (or the ``apcsim`` command) runs."""


@contextmanager
def replay_gc() -> Iterator[None]:
    """Freeze the objects that exist now and raise the first-generation threshold to at least
    ``REPLAY_GC_THRESHOLD`` for the ``with`` block; both restored after it."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], REPLAY_GC_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        gc.collect(1)  # the replay's survivors to the oldest generation, walked once (see the module docstring)
