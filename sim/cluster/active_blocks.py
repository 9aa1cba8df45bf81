"""The prompt blocks active on each worker, as Dynamo's router counts them, with the overlap of a new
prompt against every worker in one pass.

Mirrors ``ai-dynamo/dynamo`` ``lib/kv-router/src/sequences/`` (``ActiveSequences``: a request's
prompt blocks are acquired on its worker when it is routed and released when its response ends; a
block shared by several active requests of one worker counts once). The router's logit needs, per
worker ``w``, ``active_blocks_w`` (distinct blocks held) and how many of a new prompt's blocks are
already active on ``w``.

Counted worker by worker, the second is a set intersection per worker per request: with 256
replicas that was most of a Dynamo fleet's routing time. In a fleet of more than
:data:`HOLDERS_FROM` workers each active hash also keeps the bitmask of the workers holding it, so a
prompt is matched in one pass over its hashes (the masks counted in C by ``collections.Counter``),
then one step per distinct mask and worker bit; a smaller fleet keeps the intersections (a handful
of C set operations cost less than keeping the masks on every acquire and release).

Invariants: ``refs[w][h]`` is the number of ``w``'s active requests whose prompt has block ``h``
(never 0: a released block is deleted); with the masks kept, bit ``w`` of ``holders[h]`` is set iff
``h in refs[w]`` (``holders`` has no zero mask). ``overlaps`` equals ``len(refs[w].keys() & hashes)`` for every
worker (tested against that intersection). :func:`make_active_blocks` gives the compiled twin
(``sim.cluster.compiled_active``: both tables in C, one pass per prompt, same answers call for call;
this class is its oracle in the tests) for fleets of up to 64 workers where it is built. Imports
neither simpy nor torch.
"""

from __future__ import annotations

from collections import Counter, _count_elements  # type: ignore[attr-defined]  # (Counter.update's C loop)
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

_Compiled: Callable[[int], ActiveCounts] | None
try:  # the compiled twin (built by pip install -e . / setup.py build_ext)
    from sim.cluster.compiled_active import MAX_WORKERS as _MAX_COMPILED
    from sim.cluster.compiled_active import CompiledActiveBlocks as _Compiled
except ImportError:  # pragma: no cover - where the extension is not built
    _Compiled, _MAX_COMPILED = None, 0


class ActiveCounts(Protocol):
    """What Dynamo's router asks of its active blocks (:class:`ActiveBlocks` and its compiled twin)."""

    def words(self, hashes: Sequence[int]) -> Sequence[int]: ...
    def acquire(self, worker: int, hashes: Iterable[int]) -> None: ...
    def release(self, worker: int, hashes: Iterable[int]) -> None: ...
    def clear(self, worker: int) -> None: ...
    def num_active(self, worker: int) -> int: ...
    def overlaps(self, hashes: set[int]) -> dict[int, int]: ...
    def logits(self, hashes: Sequence[int], workers: list[int], overlaps: dict[int, int], prefill_tokens: list[int],
               isl: int, block_size: int, overlap_credit: float, prefill_load_scale: float,
               host: dict[int, int] | None = None, host_weight: float = 0.0) -> list[float]: ...

HOLDERS_FROM = 32
"""Fleets of more workers than this keep each active hash's holder mask (see the module docstring)."""


class ActiveBlocks:
    """Per-worker reference counts of active prompt blocks, and (large fleets) each block's holder
    mask; ``holders_kept`` overrides the choice by fleet size (the tests run both ways)."""

    __slots__ = ("refs", "holders", "keep_holders")

    def __init__(self, num_workers: int, holders_kept: bool | None = None) -> None:
        self.refs: list[dict[int, int]] = [{} for _ in range(num_workers)]
        self.holders: dict[int, int] = {}
        self.keep_holders = num_workers > HOLDERS_FROM if holders_kept is None else holders_kept

    def words(self, hashes: Sequence[int]) -> Sequence[int]:
        """The hashes in the form this class reads fastest: the list itself (the compiled twin
        gives an ``array('Q')``)."""
        return hashes

    def acquire(self, worker: int, hashes: Iterable[int]) -> None:
        """Changes state: a request with these prompt hashes is active on ``worker``."""
        refs = self.refs[worker]
        if not self.keep_holders:
            _count_elements(refs, hashes)  # refs[h] = refs.get(h, 0) + 1 for each h, in C
            return
        holders, bit = self.holders, 1 << worker
        for h in hashes:
            c = refs.get(h, 0)
            refs[h] = c + 1
            if not c:
                holders[h] = holders.get(h, 0) | bit

    def release(self, worker: int, hashes: Iterable[int]) -> None:
        """Changes state: a request with these prompt hashes ended on ``worker`` (acquired before)."""
        refs = self.refs[worker]
        if not self.keep_holders:
            for h in hashes:
                c = refs[h] - 1
                if c:
                    refs[h] = c
                else:
                    del refs[h]
            return
        holders, keep = self.holders, ~(1 << worker)
        for h in hashes:
            c = refs[h] - 1
            if c:
                refs[h] = c
            else:
                del refs[h]
                m = holders[h] & keep  # (_drop, inlined: a call per released block was a third of this)
                if m:
                    holders[h] = m
                else:
                    del holders[h]

    def clear(self, worker: int) -> None:
        """Changes state: ``worker`` holds nothing (it left the pool)."""
        if self.keep_holders:
            bit = 1 << worker
            for h in self.refs[worker]:
                self._drop(h, bit)
        self.refs[worker].clear()

    def _drop(self, h: int, bit: int) -> None:
        m = self.holders[h] & ~bit
        if m:
            self.holders[h] = m
        else:
            del self.holders[h]

    def num_active(self, worker: int) -> int:
        """Query: distinct blocks active on ``worker``."""
        return len(self.refs[worker])

    def overlaps(self, hashes: set[int]) -> dict[int, int]:
        """Query: per worker holding any, how many of ``hashes`` are active on it (absent: none)."""
        out: dict[int, int] = {}
        if not self.keep_holders:
            for w, refs in enumerate(self.refs):
                if refs:
                    n = len(refs.keys() & hashes)  # (walks the smaller side)
                    if n:
                        out[w] = n
            return out
        for mask, n in Counter(filter(None, map(self.holders.get, hashes))).items():
            while mask:
                low = mask & -mask
                w = low.bit_length() - 1
                out[w] = out.get(w, 0) + n
                mask ^= low
        return out

    def logits(self, hashes: Sequence[int], workers: list[int], overlaps: dict[int, int], prefill_tokens: list[int],
               isl: int, block_size: int, overlap_credit: float, prefill_load_scale: float,
               host: dict[int, int] | None = None, host_weight: float = 0.0) -> list[float]:
        """Query: Dynamo's logit of each of ``workers``, in that order, for a prompt of ``isl`` tokens
        whose blocks have these hashes (``sim.cluster.dynamo_router``'s docstring, the source):
        ``prefill_load_scale * max((prefill_tokens[w] + isl) / block_size - credit_w, 0)
        + num_active(w) + new_blocks_w``, where ``credit_w = overlap_credit * overlaps[w]`` (plus
        ``host_weight * host[w]`` when ``host`` has entries) and ``new_blocks_w`` is the prompt's
        blocks (the partial last one included) less those already active on ``w``. Absent keys of
        ``overlaps`` / ``host`` are 0. The compiled twin computes the same floats."""
        held = self.overlaps(set(hashes))
        blocks = -(-isl // block_size)
        out = []
        for w in workers:
            raw_prefill = (prefill_tokens[w] + isl) / block_size
            credit = overlap_credit * overlaps.get(w, 0)
            if host:
                credit += host_weight * host.get(w, 0)
            prefill = prefill_load_scale * max(raw_prefill - credit, 0.0)
            # the prompt's blocks not already active there (the partial last block always is new)
            out.append(prefill + self.num_active(w) + (blocks - held.get(w, 0)))
        return out


def make_active_blocks(num_workers: int, compiled: bool = True) -> ActiveCounts:
    """The active blocks of ``num_workers`` workers: the compiled twin when it is built, the fleet
    has at most 64 workers and ``compiled`` (the default), else :class:`ActiveBlocks`."""
    if compiled and _Compiled is not None and num_workers <= _MAX_COMPILED:
        return _Compiled(num_workers)
    return ActiveBlocks(num_workers)
