"""Which CPU-tier manager a connector builds: the compiled LRU table or the Python manager (mirrors
nothing in vLLM: vLLM has one ``CPUOffloadingManager``, ``v1/kv_offload/cpu/manager.py``; here
there are two implementations of it that must agree call for call).

* ``compiled`` (the default): :class:`sim.core.offload.chunk_table.LRUChunkTable`, a Cython module
  built by ``pip install -e .``, for the LRU policy without a ``store_threshold`` (the tier's
  default): its chunks are C arrays by chunk id and its eviction a C heap, so a chunk costs a few
  hash-table operations instead of about ten on Python objects. For ARC, a store threshold, or when
  the module is not built, the Python manager is used (the last with one message, once per process).
* ``python``: :class:`sim.core.offload.manager.CPUOffloadingManager` with its policies, the readable
  reference the compiled table is checked against (``tests/test_offload_chunk_table.py``: same
  victims, chunk ids, ranks, lookups and counters on random call sequences; the tier replays and
  vLLM agreement tests run on the compiled one).

:class:`OffloadingManager` is what the connector calls: both implement it. Invariant: the choice
changes speed only, never a result. Imports neither simpy nor torch.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence
from functools import cache
from typing import Any, Protocol, cast

from sim.core.offload.manager import CPUOffloadingManager, LookupResult, ManagerStats, PrepareStoreOutput
from sim.core.offload.policy import ChunkStatus, OffloadKey, ReqContext

MANAGER_IMPLS = ("compiled", "python")


class ChunkView(Protocol):
    """Query only: the resident chunks, read as a policy (``CachePolicy.get`` / ``keys``)."""

    def get(self, key: OffloadKey) -> ChunkStatus | None: ...

    def keys(self) -> Iterable[OffloadKey]: ...


class OffloadingManager(Protocol):
    """The CPU tier as the connector drives it (``CPUOffloadingManager``'s calls; ``first`` is the
    index of ``keys[0]`` in the request's key list, which the compiled table requires)."""

    num_chunks: int
    events: list[tuple[bool, list[OffloadKey]]] | None

    @property
    def stats(self) -> ManagerStats: ...

    @property
    def num_write_pending(self) -> int: ...

    @property
    def policy(self) -> ChunkView: ...

    def needs_positions(self) -> bool: ...

    def lookup(self, key: OffloadKey) -> LookupResult: ...

    def lookup_run(self, keys: list[OffloadKey], start: int, stop: int, stop_at_pending: bool) -> tuple[int, bool]: ...

    def first_pending(self, keys: list[OffloadKey]) -> int: ...

    def prepare_load(self, keys: list[OffloadKey], ctx: ReqContext, first: int = -1) -> None: ...

    def complete_load(self, keys: Collection[OffloadKey]) -> None: ...

    def prepare_store(self, keys: list[OffloadKey], ctx: ReqContext, first: int = -1) -> PrepareStoreOutput | None: ...

    def complete_store(self, keys: Collection[OffloadKey], chunks: Sequence[Any] | None = None) -> None: ...

    def on_request_finished(self, ctx: ReqContext) -> None: ...

    def usage(self) -> float: ...

    def num_resident(self) -> int: ...

    def check_integrity(self) -> None: ...


@cache
def compiled_table_class() -> Any:
    """The compiled LRU table class, or None (after one message on stderr) when it is not built."""
    try:
        from sim.core.offload.chunk_table import LRUChunkTable
    except ImportError as exc:
        print(
            f"apcsim: the compiled CPU-tier table is not built ({exc}); using the Python manager (same "
            "results, slower). Build it with `pip install -e .` (needs a C compiler).",
            file=sys.stderr,
        )
        return None
    return LRUChunkTable


def make_offloading_manager(
    num_chunks: int, policy: str, store_threshold: int, tokens_per_chunk: int, impl: str = "compiled",
    report_evictions: bool = True,
) -> OffloadingManager:
    """The manager of ``impl`` (see the module docstring): the compiled table when it applies and is
    built, else the Python manager; raises ValueError for an unknown ``impl`` or policy. With
    ``report_evictions`` False the compiled table leaves ``PrepareStoreOutput.evicted_keys`` empty
    unless its KV events are on (``events``): a caller that reads no victim spares it making an
    evicted key's ``bytes`` again (it holds 16-byte keys as their bytes; the Python manager's victims
    are at hand, it always lists them)."""
    if impl not in MANAGER_IMPLS:
        raise ValueError(f"unknown CPU-tier manager {impl!r}; choose one of {MANAGER_IMPLS}")
    if impl == "compiled" and policy == "lru" and store_threshold < 2:
        # (a threshold of 0 or 1 admits every key: vLLM keeps no tracker then)
        cls = compiled_table_class()
        if cls is not None:
            return cast(OffloadingManager, cls(num_chunks, tokens_per_chunk, report_evictions))
    return CPUOffloadingManager(num_chunks, policy, store_threshold)
