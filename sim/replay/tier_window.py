"""Decode windows with a CPU offload tier: when the connector's work over k steps is known in
advance, and how a window plays it (``sim.replay.decode_window`` plays the steps themselves).

vLLM 0.33.0's connector works at the end of every ``schedule()`` (``build_connector_meta`` in
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``): it refreshes each scheduled
request's keys and block ids, offers the chunks that became storable, flushes stores whose source
blocks are handed out again, and runs the final store pass and policy commit of the requests
finished since the previous step; each step's output then completes the transfers the worker
reports. A window of pure decodes plans none of that when the connector is *quiet* at its start
(:func:`tier_quiet`):

* nothing is batched for the next ``build_connector_meta`` (no load or flush is planned, no request
  finished since the last step has a chunk left to offer), no request waits for a load
  (``kv_holding_waiting``) and no load is in flight; the requests finished since the last step
  commit their accesses at the window's start, as its first step's ``build_connector_meta`` would
  (``commit_finished``: their final store pass offers nothing);
* only prompt tokens are offloaded (``offload_prompt_only``, vLLM's default), and every running
  request has offered every chunk of its prompt: a decode step's store pass is then a no-op;
* no finished request's store is in flight (``block_id_to_pending_jobs``), so no block a decoder
  allocates in the window needs a flush;
* the window has no tail (no prefill chunk: those would offer new chunks);
* stores of running requests may be in flight: the worker reports them step by step inside the
  window (:func:`play_window_transfers`); but then a step of the window may look the waiting head
  up only when the head meets no chunk still being stored and the window offers none of its
  chunks (such a lookup would defer the head, and the waiting loop would go on to the next
  request): :func:`_head_lookups_stable`, :func:`_offers_reach_head`.

With no store in flight the head's refused lookups are side-effect free (they find no pending chunk
and only reset the store progress of a request that never ran). Requests finish only at a window's
last step, so their final pass and commit run in the next step, as in the plain loop. After a window
the connector's step count moves on by k and every bulk request's keys and block ids are brought up
to date (its block ids are its block table: vLLM's are the admitted table extended by each step's
new blocks).

Invariant: a window's tables, stats, KV events and tier counters equal the plain loop's
(``tests/test_tier_window.py``). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.core.offload.manager import LookupResult
from sim.core.offload.request_state import (
    RequestOffloadState,
    catch_up,
    chunk_blocks,
    prompt_offered,
    prompts_offered,
)
from sim.core.offload.tier import OffloadTier
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.transfer_job import KVConnectorMetadata, KVConnectorOutput, TransferJob
from sim.replay.decode_window import Window
from sim.replay.intake import ARRIVAL_EPS_S
from sim.replay.kv_transfer import LinkKVWorker


def tier_quiet(sched: Scheduler, tier: OffloadTier) -> bool:
    """Query: a decode window may start now (see the module docstring; the window itself, its
    requests included, is checked by :func:`window_allowed`)."""
    conn = tier.connector
    return not (not conn.offload_prompt_only or tier.kv_holding_waiting or tier.finished_recving
                or conn.has_step_work() or conn.block_id_to_pending_jobs or conn.chunks_being_loaded)


def _offerers(sched: Scheduler, tier: OffloadTier, window: Window) -> list[Request] | None:
    """Query: the window's tail requests that offer chunks in it (see the module docstring), or
    None when the window is not allowed."""
    conn = tier.connector
    tpc, bpc, hpc = conn.tokens_per_chunk, conn.blocks_per_chunk, conn.hashes_per_chunk
    status = conn.req_status
    if not prompts_offered(status, window.bulk, tpc, bpc):
        return None  # (e.g. an offer left after an allocation failure)
    offerers: list[Request] = []
    max_len = sched.config.max_model_len
    for r, steps in zip(window.tail, window.tail_steps, strict=True):
        st = status.get(r.request_id)
        if st is None:
            return None
        if prompt_offered(st, r, tpc, bpc):
            continue
        n_samples = sum(1 for s in steps if s.samples)
        if n_samples and (len(r.output_token_ids) + n_samples >= r.max_tokens or r.num_tokens + n_samples >= max_len):
            return None  # it would finish at the last step: its stores' blocks are watched then
        if len(r.block_hashes) // hpc < r.num_prompt_tokens // tpc:
            return None  # its keys would bound an offer
        offerers.append(r)
    return offerers


def window_allowed(sched: Scheduler, tier: OffloadTier, window: Window) -> bool:
    """Query: a window planned while the connector was quiet: its bulk has offered every chunk, its
    offering prefills (:func:`_offerers`) finish in it and need no key it lacks; a lookup of the
    waiting head while a store is in flight or may start only when it meets no chunk being stored
    (:func:`_head_lookups_stable`) and the offers reach none of the head's chunks
    (:func:`_offers_reach_head`); with the tier's KV events on, no store in flight or offered at all
    (a window reports its steps' completions around its block operations, so their CPU
    ``BlockStored`` would not interleave with the steps' own events as the plain loop's do)."""
    offerers = _offerers(sched, tier, window)
    if offerers is None:
        return False
    stores = bool(tier.connector.jobs or offerers)
    if stores and tier.kv_events is not None:
        return False
    if stores and any(window.lookups):
        return _head_lookups_stable(sched, tier) and not _offers_reach_head(sched, tier, offerers)
    return True


def _offers_reach_head(sched: Scheduler, tier: OffloadTier, offerers: list[Request]) -> bool:
    """Query: a chunk the window's offerers may offer is one of the waiting head's: that chunk would
    be pending at a later step's lookup of the head. Otherwise the window's offers change the head's
    lookups only by evicting: a smaller CPU hit, never a deferral, and the head stays refused
    (``sim.replay.window_gates.head_stays_refused``: its refusal holds whatever its hits).
    A key names its whole prefix (a chain of block hashes), so an offered key can equal a head's key
    only at the same chunk index, and then so do their keys at every smaller index: comparing the
    first offered chunk's key (index ``next_stored_chunk_idx``) with the head's decides."""
    if not offerers:
        return False
    conn = tier.connector
    bpc = conn.blocks_per_chunk
    head = sched.waiting.peek().block_hashes
    for r in offerers:
        j = (conn.req_status[r.request_id].next_stored_chunk_idx + 1) * bpc - 1  # (the hash keying that chunk)
        hashes = r.block_hashes
        if j < len(head) and j < len(hashes) and hashes[j] == head[j]:
            return True
    return False


def _head_lookups_stable(sched: Scheduler, tier: OffloadTier) -> bool:
    """Query (its answer kept on the head's state): the waiting head's lookups in a window whose
    stores are in flight meet no chunk being stored: the head has no job in flight (else it is
    deferred) and none of its chunks the tier holds is being stored now. A store only completes in
    the window, and its offers, which reach none of the head's chunks (:func:`_offers_reach_head`),
    only evict, so every lookup -- from whatever GPU-hit boundary -- meets ready chunks or none."""
    head = sched.waiting.peek()
    conn = tier.connector
    st = conn.req_status.get(head.request_id)
    if st is None or st.transfer_jobs:
        return False
    bpc = conn.blocks_per_chunk
    # the chunks being stored are the keys of the store jobs in flight: when they are all this
    # connector's (a fleet's shared store has other writers), a job's keys meet the head's only if
    # its first key is the head's key at that chunk index (keys name their whole prefix, see
    # _offers_reach_head) -- one comparison per job instead of a probe per head chunk
    hashes = head.block_hashes
    num_pending = 0
    for job in conn.jobs.values():
        if job.is_store:
            num_pending += len(job.keys)
            j = (job.first + 1) * bpc - 1
            if j < len(hashes) and hashes[j] == job.keys[0]:
                return False
    if num_pending == conn.manager.num_write_pending:
        return True
    # remembered from the last check: pending chunks appear only with a store (chunks_stored grows)
    stored = conn.manager.stats.chunks_stored
    if st.head_stable_at == stored:
        return True
    keys = hashes[bpc - 1 :: bpc]  # (the keys of its full chunks, as its lookup takes them)
    i = st.head_pending_chunk
    if 0 <= i < len(keys) and conn.manager.lookup(keys[i]) is LookupResult.HIT_PENDING:
        return False
    i = conn.manager.first_pending(keys)
    if i >= 0:
        st.head_stable_at, st.head_pending_chunk = -1, i
        return False
    st.head_stable_at = stored
    return True


def play_window_transfers(
    sched: Scheduler, tier: OffloadTier, worker: LinkKVWorker, window: Window, apply_steps: Callable[[], None]
) -> None:
    """Changes state: the window's steps (``apply_steps()``, ``sim.replay.window_apply``) with the
    connector's work and the worker's reports of each step: the finished requests' commit first,
    then per step the offering prefills' offers (``build_store_job``, their source blocks filled in
    after the window) and, for the steps before the last, the step's report -- all before the
    window's block operations (nothing in them reads the connector, nor the offers the pool) --
    and the last step's report after them, as ``update_from_output`` completes it after freeing
    the finished requests."""
    conn = tier.connector
    conn.commit_finished()  # the first step's build_connector_meta (finished requests)
    offerers = _offerers(sched, tier, window)
    assert offerers is not None
    hpc, tpc = conn.hashes_per_chunk, conn.tokens_per_chunk
    k = window.k
    offers: list[list[tuple[RequestOffloadState, int]]] = [[] for _ in range(k)]
    if offerers:
        of_tail = {id(r) for r in offerers}
        for r, steps in zip(window.tail, window.tail_steps, strict=True):
            if id(r) in of_tail:  # (tail order is running order: each step's offers in its order)
                st = conn.req_status[r.request_id]
                st.update_offload_keys(hpc, tpc)  # (a prefill's keys: all hashed at admission)
                for s in steps:
                    offers[s.step].append((st, s.computed_before + s.num_new))
    late: list[tuple[int, RequestOffloadState, int, int, list[int]]] = []
    last: KVConnectorOutput | None = None
    if offerers or worker.has_pending():
        first = sched.step_index
        starts = window.starts
        due = worker.next_done_at()
        for j in range(k):
            meta = None
            if offers[j]:
                jobs: list[TransferJob] = []
                for st, n_after in offers[j]:
                    conn.build_store_job(st, n_after, jobs, late)
                meta = KVConnectorMetadata([], jobs, set())
            elif starts[j + 1] + ARRIVAL_EPS_S < due:
                continue  # (the worker reports nothing in this step: its empty report changes nothing)
            worker.start_step(first + j, starts[j], meta)
            rep = worker.finish_step(first + j, starts[j + 1])
            due = worker.next_done_at()
            if j < k - 1:
                tier.update_from_kv_xfer_finished(rep)
            else:
                last = rep
    apply_steps()
    if last is not None:
        tier.update_from_kv_xfer_finished(last)
    after_tier_window(sched, tier, window, late)


def after_tier_window(
    sched: Scheduler, tier: OffloadTier, window: Window,
    late: list[tuple[int, RequestOffloadState, int, int, list[int]]],
) -> None:
    """Changes state: the connector after a played window (see the module docstring)."""
    conn = tier.connector
    conn.step += window.k
    kvm = sched.kv_cache_manager
    hpc, tpc, bpc = conn.hashes_per_chunk, conn.tokens_per_chunk, conn.blocks_per_chunk
    # (the window's new blocks are appended, not the whole table copied: a copy per window cost
    # 1.5 s of a 2,000-request Mooncake bench)
    catch_up(conn.req_status, window.bulk, kvm, hpc, tpc)
    catch_up(conn.req_status, window.tail, kvm, hpc, tpc)
    for r, steps in zip(window.tail, window.tail_steps, strict=True):
        if any(s.samples for s in steps):  # scheduled past its prefill (vLLM _update_after_schedule)
            tier.inflight_prefills.pop(r.request_id, None)
    for job_id, st, first, end, chunk_ids in late:  # the window's store jobs get their source blocks
        job = conn.jobs.get(job_id)
        if job is not None:
            job.source_blocks = chunk_blocks(st.blocks, first, end, chunk_ids, bpc)
            assert len(job.source_blocks) == len(job.keys) * bpc
