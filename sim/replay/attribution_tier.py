"""The CPU offload tier as the miss attribution of :mod:`sim.replay.attribution` reads it (mirrors
the lookup of vLLM 0.33.0's ``OffloadingConnectorScheduler._lookup_complete_chunks`` /
``_maximal_prefix_lookup``, ``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``, for
one full-attention group; ``sim.core.offload.connector`` is its reimplementation).

With a tier, a first admission's prompt splits into the GPU hit ``[0, local)``, the CPU hit
``[local, local + ext)`` (the chunks the admission loads: a hit source, not a miss) and the missed
tokens. The connector's lookup starts at chunk ``s = local // tokens_per_chunk`` and counts the
**consecutive** chunks the tier holds (ready or still being stored); the run ends at chunk ``e``
(the first chunk it does not hold, or the last full chunk). A loaded hit is exactly that run:
``local + ext == e * tokens_per_chunk`` (asserted). A missed scheduler block ``j`` (GPU miss, past
the CPU hit) whose chunk ``c = j // blocks_per_chunk`` the tier holds at the lookup is then:

* ``cpu_partial_chunk`` -- ``c < e``: the tier holds the block in the run from the GPU-hit boundary,
  but the run past the GPU hit is under one chunk (a GPU hit ending inside a chunk; vLLM loads whole
  chunks: ``hit < tokens_per_chunk -> 0``). Only with ``blocks_per_chunk > 1``, and only with no CPU
  hit;
* ``unreachable`` -- ``c >= e``: an earlier block missed in both tiers (the CPU run stopped at a gap,
  as the GPU run did), the contiguous-prefix rule of both lookups.

A block whose chunk the tier does not hold (evicted from it, never stored: a failed allocation, the
``store_threshold`` filter, a chunk not yet full) keeps the untiered rules, so ``evicted`` reads
"evicted from both tiers". Lookups that defer (a counted chunk still being stored or loaded by
another request, the request's own jobs in flight) admit nothing: the request is classified at the
lookup that admits it, which holds no such chunk in its run unless the run is under one chunk.
A ``prompt_logprobs`` request reads neither tier (``skip``).

Invariants: reads the tier (``CPUOffloadingManager.lookup``, a query), changes nothing; called at
the admission's allocation, before any block is touched, so the GPU and CPU state are those both
lookups saw. Imports sim.core only.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.offload.manager import LookupResult
from sim.core.offload.policy import OffloadKey
from sim.core.offload.tier import OffloadTier
from sim.core.request import Request

READY, PENDING = "ready", "pending"
"""How the tier holds a chunk at the lookup: stored, or its store still in flight (HIT_PENDING)."""


@dataclass(frozen=True, slots=True)
class CpuBlock:
    """A missed block whose chunk the CPU tier holds: its chunk, whether it lies in the lookup's run
    from the GPU-hit boundary (``in_run``: ``cpu_partial_chunk``, else ``unreachable``) and how the
    tier holds it (:data:`READY` or :data:`PENDING`)."""

    chunk: int
    in_run: bool
    state: str


class TierLookup:
    """The CPU tier of a scheduler's offload connector, read at a first admission."""

    def __init__(self, tier: OffloadTier) -> None:
        conn = tier.connector
        self.connector = conn
        self.manager = conn.manager
        self.blocks_per_chunk = conn.blocks_per_chunk
        self.tokens_per_chunk = conn.tokens_per_chunk

    def held_blocks(self, r: Request, local: int, ext: int, first: int, cap: int) -> dict[int, CpuBlock]:
        """Query: the missed blocks ``j`` in ``[first, cap)`` whose chunk the tier holds, for a
        request whose lookups gave ``local`` GPU and ``ext`` CPU hit tokens (module docstring)."""
        bpc, tpc = self.blocks_per_chunk, self.tokens_per_chunk
        keys: list[OffloadKey] = self.connector.state(r.request_id).keys  # the lookup's keys, full chunks
        num_keys = len(keys)
        lookup = self.manager.lookup
        states: dict[int, str] = {}

        def state(c: int) -> str | None:
            if c >= num_keys:
                return None
            s = states.get(c)
            if s is None:
                res = lookup(keys[c])
                s = states[c] = "" if res is LookupResult.MISS else READY if res is LookupResult.HIT else PENDING
            return s or None

        end = local // tpc
        while state(end) is not None:
            end += 1
        if ext:
            assert local + ext == end * tpc, (
                f"{r.request_id}: CPU hit [{local}, {local + ext}) is not the tier's run from chunk "
                f"{local // tpc} to chunk {end} ({tpc} tokens per chunk)"
            )
        out: dict[int, CpuBlock] = {}
        for j in range(first, cap):
            c = j // bpc
            s = state(c)
            if s is not None:
                out[j] = CpuBlock(c, c < end, s)
        return out
