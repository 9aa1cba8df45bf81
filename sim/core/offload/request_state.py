"""The connector's per-request state (mirrors vLLM 0.33.0's ``RequestOffloadState`` /
``RequestGroupState`` / ``TransferJobStatus`` of ``distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py``, for one full-attention KV group).

Invariants: ``keys[i]`` is the hash of the request's GPU block ``(i + 1) * blocks_per_chunk - 1``
(full chunks only) and its position is ``(i + 1) * tokens_per_chunk``; ``blocks`` is the
request's GPU block table as the scheduler reported it (cleared at every lookup, whole on admission,
extended by each step's new blocks); ``next_stored_chunk_idx`` only grows between lookups; at any
time ``transfer_jobs`` holds either one load or any number of stores. Imports nothing from the
project beyond ``sim.core.request``, ``sim.core.kv_cache_block``, ``sim.core.kv_cache_manager`` and
this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_manager import KVCacheManager
from sim.core.offload.policy import OffloadKey, ReqContext
from sim.core.request import FINISHED_ABORTED, Request


@dataclass(slots=True)
class ConnectorStats:
    """Cumulative connector counters (vLLM's ``OffloadingConnectorStats``, job counts, and the
    ``connector_prefix_cache_stats`` the scheduler records at each admission)."""

    allocation_failures: int = 0  # vllm:kv_offload_allocation_failure
    load_jobs: int = 0
    store_jobs: int = 0
    blocks_loaded: int = 0
    blocks_stored: int = 0
    deferred_lookups: int = 0  # lookups answered None


@dataclass(slots=True)
class JobStatus:
    """One in-flight job: its request, its keys (for complete_store/complete_load) and, for a store,
    its source GPU blocks (watched for re-allocation once the request has finished) and the CPU
    chunks allocated for its keys (``PrepareStoreOutput.chunks``)."""

    req_id: str
    keys: list[OffloadKey]
    is_store: bool
    # the source blocks themselves, their ids read only when asked (source_block_ids): a pool's
    # block is one object for its id's lifetime, and most stores never need the ids
    source_blocks: list[KVCacheBlock] = field(default_factory=list)
    chunks: Sequence[Any] = field(default_factory=list)  # the manager's records of them (opaque here)
    first: int = -1  # a store's: the chunk index of keys[0] in its request's key list

    @property
    def source_block_ids(self) -> list[int]:
        """Query: the ids of the source blocks (vLLM's ``TransferJobStatus`` block ids)."""
        return [b.block_id for b in self.source_blocks]


@dataclass(slots=True)
class RequestOffloadState:
    """What the connector tracks for one request, from ``add_request`` until it finished and its
    jobs completed."""

    req: Request
    ctx: ReqContext
    keys: list[OffloadKey] = field(default_factory=list)
    # the GPU block table as reported, as block objects (a block's id is read only for the stores
    # that need it: a finished request's watched sources, the GPU backend's copies)
    blocks: list[KVCacheBlock] = field(default_factory=list)
    next_stored_chunk_idx: int = 0
    num_locally_computed_tokens: int = 0  # the GPU hit of the last lookup
    num_loaded_tokens: int = 0  # the CPU hit of the last load (0: none)
    load_step: int = -1  # the schedule() step that started the last load
    transfer_jobs: set[int] = field(default_factory=set)
    finished_signaled: bool = False
    # the Python manager's policies read each key's position from ctx.key_positions; the compiled
    # tier takes a key's index instead (chunk_table.pyx), so the dict is not built for it
    track_positions: bool = True
    # its last check as a decode window's waiting head (sim.replay.tier_window): the manager's
    # chunks_stored when none of its chunks was pending (-1: unknown), or a pending chunk's index
    head_stable_at: int = -1
    head_pending_chunk: int = -1
    # build_connector_meta's decode test held at the request's last full pass (prompt_only, its prompt
    # computed and all offered): n_after and next_stored_chunk_idx only grow until its next admission,
    # which recomputes it, so a later step without new blocks skips reading the step's fields again
    prompt_offered: bool = False

    def update_offload_keys(self, hashes_per_chunk: int, tokens_per_chunk: int) -> None:
        """Extend ``keys`` with the request's newly full chunks (vLLM ``update_offload_keys``)."""
        keys = self.keys
        hashes = self.req.block_hashes
        if keys is hashes:
            return  # (the request's own hash list: see below)
        n = len(keys)
        if len(hashes) < hashes_per_chunk * (n + 1):
            return  # no new full chunk (the usual decode step)
        if not self.track_positions:
            if hashes_per_chunk == 1 and n == 0:
                # a chunk is a block, so the keys ARE the block hashes: share the request's list
                # (append-only while it runs; release_tokens gives the request a new one) instead of
                # copying and later freeing every key reference once more -- at block 16, 27 M
                # prompt tokens made 1.7 M copied references. Every reader calls this method first
                # (lookup, offer, finish, tier window), so it sees the same keys as with a copy.
                self.keys = hashes
                return
            keys.extend(hashes[hashes_per_chunk * (n + 1) - 1 :: hashes_per_chunk])
            return
        positions = self.ctx.key_positions
        end = n * tokens_per_chunk
        for i in range(hashes_per_chunk * (n + 1) - 1, len(hashes), hashes_per_chunk):
            key = hashes[i]
            keys.append(key)
            end += tokens_per_chunk  # the key of chunk j ends at token (j + 1) * tokens_per_chunk
            positions[key] = end

    def storable_chunks(self, num_offloadable_tokens: int, tokens_per_chunk: int, blocks_per_chunk: int) -> int:
        """Query: leading chunks that are computed, allocated and keyed (vLLM ``storable_chunks``)."""
        return min(num_offloadable_tokens // tokens_per_chunk, len(self.blocks) // blocks_per_chunk, len(self.keys))

    def advance_stored_idx(self, num_offloadable_tokens: int, tokens_per_chunk: int, blocks_per_chunk: int) -> None:
        """Skip the chunks nothing needs to store (vLLM ``advance_stored_idx``; never backwards)."""
        self.next_stored_chunk_idx = max(
            self.next_stored_chunk_idx, self.storable_chunks(num_offloadable_tokens, tokens_per_chunk, blocks_per_chunk)
        )

    def final_offer_end(self, tokens_per_chunk: int, blocks_per_chunk: int, prompt_only: bool) -> int:
        """Query: the storable chunks of a finished request's final store pass (vLLM
        ``_build_store_jobs`` for a finished request: its tokens up to the commit point)."""
        req = self.req
        if req.status == FINISHED_ABORTED:
            n = req.num_computed_tokens
        else:  # the commit point of the GPU cache: the last sampled token's slot is never stored
            n = max(req.num_prompt_tokens, req.num_tokens - 1)
        n = min(n, req.num_tokens)
        if prompt_only:
            n = min(n, req.num_prompt_tokens)
        return self.storable_chunks(n, tokens_per_chunk, blocks_per_chunk)


def stored_tail(offered: list[OffloadKey], stored: list[OffloadKey], start: int) -> int:
    """Query: the chunk index of the first ``stored`` key when the stored keys of an offer of
    ``offered`` (the request's keys from index ``start``) are its last ones -- the usual partial
    offer: a resident head, the rest new --, else -1 (see :func:`stored_indices`)."""
    n = len(stored)
    k = len(offered) - n
    j = 0
    while j < n and offered[k + j] is stored[j]:
        j += 1
    return start + k if j == n else -1  # (a key has one position in the offer: they are its last n)


def stored_indices(offered: list[OffloadKey], stored: list[OffloadKey], start: int) -> list[int]:
    """Query: the chunk indices of the ``stored`` keys of an offer of ``offered`` (the request's keys
    from index ``start``); ``stored`` is a subsequence of ``offered`` in its order (``prepare_store``
    keeps the offer's order) and a request's keys are distinct, so one walk pairs them."""
    first = stored_tail(offered, stored, start)
    if first >= 0:
        return list(range(first, first + len(stored)))
    return _paired_indices(offered, stored, start)


def stored_run(offered: list[OffloadKey], stored: list[OffloadKey], start: int) -> tuple[int, list[int]]:
    """Query: a partial offer's stored chunks as ``(first, indices)``: the chunks ``[first, end of
    the offer)`` and no list when they are its tail (:func:`stored_tail`), else the first of the
    listed indices and the list (:func:`stored_indices`)."""
    first = stored_tail(offered, stored, start)
    if first >= 0:
        return first, []
    indices = _paired_indices(offered, stored, start)
    return indices[0], indices


def _paired_indices(offered: list[OffloadKey], stored: list[OffloadKey], start: int) -> list[int]:
    """:func:`stored_indices` by the walk that pairs each stored key with its offered position
    (when the stored keys are not the offer's tail)."""
    n = len(stored)
    out: list[int] = []
    j = 0
    for i, key in enumerate(offered):
        if j < n and (key is stored[j] or key == stored[j]):  # (both managers return the offered objects)
            out.append(start + i)
            j += 1
    assert j == n, "the stored keys are not a subsequence of the offer"
    return out


def chunk_blocks(
    blocks: list[KVCacheBlock], first: int, end: int, chunk_ids: list[int], blocks_per_chunk: int
) -> list[KVCacheBlock]:
    """Query: a store job's source blocks in the request's block table ``blocks``: those of the chunks
    ``[first, end)``, or of the listed ``chunk_ids`` when not all of them were stored (non-empty then)."""
    if not chunk_ids:
        return blocks[first * blocks_per_chunk : end * blocks_per_chunk]
    lo, hi = chunk_ids[0], chunk_ids[-1]
    if hi - lo + 1 == len(chunk_ids):  # (ascending and distinct: a run, usually the offer's tail)
        return blocks[lo * blocks_per_chunk : (hi + 1) * blocks_per_chunk]
    out: list[KVCacheBlock] = []
    for i in chunk_ids:  # (block by block: a slice per chunk cost more than the offer itself)
        for j in range(i * blocks_per_chunk, (i + 1) * blocks_per_chunk):
            out.append(blocks[j])
    return out


class StepAllocations:
    """The block ids allocated in one step (vLLM's ``_current_batch_allocated_block_ids``): the
    block lists the step hands over, made a set of ids only when read -- only a finished request's store in
    flight reads it (its source blocks are watched for re-allocation), so most steps never do."""

    def __init__(self) -> None:
        self._blocks: list[list[KVCacheBlock]] = []
        self._set: set[int] | None = None

    def add_new(self, blocks: list[KVCacheBlock]) -> None:
        """Note ``blocks`` (a step's own list of new blocks, never changed after) as allocated in
        this step."""
        self._blocks.append(blocks)
        self._set = None

    def add_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Note ``blocks`` (copied: the caller's list may change) as allocated in this step."""
        self._blocks.append(list(blocks))
        self._set = None

    def ids(self) -> set[int]:
        """Query: every id noted, the null block (0) left out."""
        out = self._set
        if out is None:
            out = set()
            for blocks in self._blocks:
                out.update([b.block_id for b in blocks])
            out.discard(0)
            self._set = out
        return out


def prompt_offered(st: RequestOffloadState, r: Request, tokens_per_chunk: int, blocks_per_chunk: int) -> bool:
    """Query: ``r`` computed its prompt and offered every storable chunk of it (its decode steps
    offer nothing: ``offload_prompt_only``)."""
    prompt = r.num_prompt_tokens
    if r.num_computed_tokens < prompt:
        return False
    # (past the prompt's last full chunk nothing is storable: no need to count)
    idx = st.next_stored_chunk_idx
    return idx * tokens_per_chunk > prompt - tokens_per_chunk or idx >= st.storable_chunks(
        prompt, tokens_per_chunk, blocks_per_chunk
    )


def prompts_offered(
    status: dict[str, RequestOffloadState], requests: list[Request], tokens_per_chunk: int, blocks_per_chunk: int
) -> bool:
    """Query: every request of ``requests`` is tracked and :func:`prompt_offered` (a decode window's
    bulk, checked at each window: compiled here, as the connector is)."""
    for r in requests:
        st = status.get(r.request_id)
        if st is None or not prompt_offered(st, r, tokens_per_chunk, blocks_per_chunk):
            return False
    return True


def catch_up(
    status: dict[str, RequestOffloadState], requests: list[Request], kvm: KVCacheManager,
    hashes_per_chunk: int, tokens_per_chunk: int,
) -> None:
    """Bring the states of ``requests`` up to date after a decode window (whose steps never ran the
    connector): their keys, and their block tables, to which the blocks the window allocated are
    appended (a table only grows in a window; a request that finished at its last step holds none)."""
    held = kvm.request_ids()
    for r in requests:
        rid = r.request_id
        st = status.get(rid)
        if st is None:
            continue
        st.update_offload_keys(hashes_per_chunk, tokens_per_chunk)
        if rid in held:
            blocks = kvm.get_blocks(rid)
            n = len(st.blocks)
            if len(blocks) > n:
                st.blocks.extend(blocks[n:])
