"""The offload connector's scheduler side (mirrors vLLM 0.33.0's ``OffloadingConnectorScheduler``,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``, for one full-attention KV group, no partial
tails, no sync-load budget, one worker).

Per step, in the order vLLM's ``Scheduler.schedule`` calls it:

1. ``get_num_new_matched_tokens(request, local_hit)`` (waiting loop, fresh or re-admitted request): resets the
   request's block table and ``next_stored_chunk_idx``; defers (None) while the request still has jobs in flight;
   else counts **consecutive** resident chunks from chunk ``local_hit // tokens_per_chunk``, bounded by
   ``min(num_tokens, #keys * tokens_per_chunk)`` (not ``num_tokens - 1``); the hit is ``tokens_per_chunk * (start +
   count) - local_hit``, and **0 if it is under one chunk**; None if a counted chunk is still being stored
   (HIT_PENDING) or one of them is being loaded by another request. Every hit is an async load (vLLM's default
   ``sync_load_budget_bytes`` 0).
2. ``update_state_after_alloc(request, blocks, ext)``: notes every allocated block (re-allocation flushes); with a
   hit, pins the chunks (``prepare_load``), creates the load job and sets ``next_stored_chunk_idx`` past the hit, so
   neither GPU-hit nor loaded chunks are offered again.
3. ``build_connector_meta(output)`` (end of ``schedule``): updates keys and block tables from the step's scheduled
   requests; flushes the in-flight jobs of requests preempted in this step and the stores (of finished requests)
   whose source blocks were re-allocated in this step; then for every scheduled request (scheduled order) and every
   request finished since the last step offers chunks ``[next_stored_chunk_idx, storable)`` in one ``prepare_store``
   -- ``storable`` clamps the computed tokens after this step to the prompt (``offload_prompt_only``), the allocated
   blocks and the keys; a finished request uses ``max(num_prompt_tokens, num_tokens - 1)``. A failed allocation
   (None) counts and leaves the index, so the chunks are offered again next step. Finally the finished requests'
   accesses are committed to the policy.
4. ``update_connector_output(out)``: completes stores and loads (unpinning, ``chunks_being_loaded``).

Invariants: ``jobs`` holds exactly the in-flight jobs; a request's state lives until it finished and its last job
completed; ``has_pending_push_work`` is true while any job is in flight (the engine keeps stepping). Imports nothing
from the project beyond ``sim.core`` leaves and this package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sim.core.kv_cache_block import KVCacheBlock
from sim.core.kv_cache_spec import cdiv
from sim.core.offload.events import OffloadingEventsTracker
from sim.core.offload.manager_impl import OffloadingManager, make_offloading_manager
from sim.core.offload.policy import OffloadKey, ReqContext
from sim.core.offload.request_state import (
    ConnectorStats,
    JobStatus,
    RequestOffloadState,
    StepAllocations,
    chunk_blocks,
    stored_run,
)
from sim.core.request import PREEMPTED, Request
from sim.core.transfer_job import KVConnectorMetadata, KVConnectorOutput, TransferJob

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.config import OffloadConfig
    from sim.core.scheduler_output import SchedulerOutput


class OffloadingConnectorScheduler:
    """The connector (see the module docstring). Methods change state unless they say Query."""

    def __init__(self, config: OffloadConfig, block_size: int, manager_impl: str = "compiled",
                 manager: OffloadingManager | None = None) -> None:
        self.config = config
        self.block_size = block_size
        self.blocks_per_chunk = config.blocks_per_chunk
        self.tokens_per_chunk = block_size * config.blocks_per_chunk
        self.hashes_per_chunk = config.blocks_per_chunk  # the hash block size is the block size
        self.offload_prompt_only = config.offload_prompt_only
        # (sim.core.offload.manager_impl's choice, or ``manager``: one built already -- a fleet's shared
        # store); the connector reads no evicted key (the KV events take theirs from ``manager.events``)
        self.manager: OffloadingManager = manager if manager is not None else make_offloading_manager(
            config.num_cpu_chunks, config.policy, config.store_threshold, self.tokens_per_chunk, manager_impl,
            report_evictions=False)
        self.req_status: dict[str, RequestOffloadState] = {}
        self.jobs: dict[int, JobStatus] = {}
        self._job_counter = 0
        self.chunks_being_loaded: set[OffloadKey] = set()
        # block id -> store jobs reading it; only for finished requests (a running request's blocks
        # are protected by their ref count)
        self.block_id_to_pending_jobs: dict[int, set[int]] = {}
        self._batch_load_jobs: list[TransferJob] = []
        self._batch_jobs_to_flush: set[int] = set()
        self._batch_allocated = StepAllocations()  # vLLM _current_batch_allocated_block_ids
        self._finished_order: list[str] = []  # requests finished since the last step, in free order
        self.stats = ConnectorStats()
        # vLLM OffloadingEventsTracker (sim.core.offload.events): set by OffloadTier when the
        # engine's KV events are on; None costs nothing
        self.events_tracker: OffloadingEventsTracker | None = None
        self.step = 0  # schedule() calls seen (build_connector_meta count)

    def _new_job_id(self) -> int:
        job_id = self._job_counter
        self._job_counter += 1
        return job_id

    # -- requests -----------------------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        """Start tracking a request (``Scheduler.add_request``)."""
        self.req_status[request.request_id] = RequestOffloadState(
            request, ReqContext(request.request_id), track_positions=self.manager.needs_positions()
        )  # (read per request: the manager may be a fleet's shared store, handed in at construction)

    def state(self, request_id: str) -> RequestOffloadState:
        """Query: a tracked request's state."""
        return self.req_status[request_id]

    def request_finished(self, request: Request) -> None:
        """The request finished, before its blocks are freed (vLLM ``request_finished``): its last
        keys are taken, and the source blocks of its in-flight stores are watched from now on."""
        st = self.req_status.get(request.request_id)
        if st is None:
            return
        self._finished_order.append(request.request_id)
        st.update_offload_keys(self.hashes_per_chunk, self.tokens_per_chunk)
        for job_id in st.transfer_jobs:
            job = self.jobs[job_id]
            for bid in job.source_block_ids:
                self.block_id_to_pending_jobs.setdefault(bid, set()).add(job_id)

    def has_pending_push_work(self) -> bool:
        """Query: some job is in flight, so the engine must keep stepping."""
        return bool(self.jobs)

    def has_step_work(self) -> bool:
        """Query: the next ``build_connector_meta`` has jobs to hand out, or a request finished since
        the last step still has chunks to offer (decode windows wait; a commit alone can run at a
        window's start: :meth:`commit_finished`)."""
        if self._batch_load_jobs or self._batch_jobs_to_flush:
            return True
        tpc, bpc, prompt_only = self.tokens_per_chunk, self.blocks_per_chunk, self.offload_prompt_only
        for rid in self._finished_order:
            st = self.req_status.get(rid)
            if st is not None and st.final_offer_end(tpc, bpc, prompt_only) > st.next_stored_chunk_idx:
                return True
        return False

    def commit_finished(self) -> None:
        """The part of a decode step's ``build_connector_meta`` that a decode window plays at its
        start: the requests finished since the last step, whose final store pass offers nothing
        (``has_step_work`` is false), commit their accesses to the policy."""
        if self._finished_order:
            assert not self.has_step_work(), "a finished request still has chunks to offer"
            self._commit_finished()

    # -- lookup -------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """CPU-hit tokens past the GPU hit ``num_computed_tokens`` (None: defer the request this
        step) and whether they load asynchronously. Resets the request's store progress."""
        st = self.req_status[request.request_id]
        st.blocks.clear()
        st.next_stored_chunk_idx = 0  # restarting at token 0: offer every chunk again
        if st.transfer_jobs:
            self.stats.deferred_lookups += 1
            return None, False
        st.update_offload_keys(self.hashes_per_chunk, self.tokens_per_chunk)
        st.num_locally_computed_tokens = num_computed_tokens
        hit = 0 if request.skip_reading_prefix_cache else self._lookup(st)
        if hit is None:
            self.stats.deferred_lookups += 1
        return hit, bool(hit)

    def _lookup(self, st: RequestOffloadState) -> int | None:
        """vLLM ``_lookup_complete_chunks`` for one full-attention group."""
        tpc = self.tokens_per_chunk
        local = st.num_locally_computed_tokens
        keys = st.keys
        max_hit = min(st.req.num_tokens, len(keys) * tpc)
        if max_hit - local < tpc:
            return 0
        num_chunks = min(cdiv(max_hit, tpc), len(keys))
        start = local // tpc
        # (without KV events a pending chunk decides: the count past it is not needed)
        count, pending = self.manager.lookup_run(keys, start, num_chunks, self.events_tracker is None)
        if count == 0:
            return 0
        if self.events_tracker is not None:  # vLLM record_lookup of every counted chunk
            self.events_tracker.record_lookup(st, start, keys[start : start + count])
        if not pending:
            max_hit = min(max_hit, tpc * (start + count))
        hit = max_hit - local
        if hit < tpc:
            return 0
        if pending:
            return None  # a counted chunk is still being stored
        if self.chunks_being_loaded:
            loading = self.chunks_being_loaded
            if any(k in loading for k in keys[start : cdiv(local + hit, tpc)]):
                return None  # another request's load brings these chunks in
        return hit

    # -- admission ----------------------------------------------------------------------------
    def update_state_after_alloc(
        self, request: Request, blocks: Sequence[KVCacheBlock], num_external_tokens: int
    ) -> None:
        """The request was allocated ``blocks`` (all of them); with ``num_external_tokens`` > 0,
        start its load (vLLM ``update_state_after_alloc``)."""
        self._batch_allocated.add_blocks(blocks)
        if num_external_tokens == 0:
            return
        st = self.req_status[request.request_id]
        bs = self.block_size
        local = st.num_locally_computed_tokens
        num_cached = local + num_external_tokens
        num_gpu_blocks = cdiv(num_cached, bs)
        # the blocks past the GPU hit were just allocated (caching delayed): the first of them
        # starts the load region
        load_start = cdiv(local, bs)
        num_pending_blocks = num_gpu_blocks - load_start
        num_chunks = cdiv(num_cached, self.tokens_per_chunk)
        keys = st.keys[load_start // self.blocks_per_chunk : num_chunks] if num_pending_blocks else []
        st.next_stored_chunk_idx = num_chunks  # CHUNK_LEVEL policy: hits are not offered again
        self.manager.prepare_load(keys, st.ctx, load_start // self.blocks_per_chunk)
        job_id = self._new_job_id()
        self._batch_load_jobs.append(TransferJob(job_id, request.request_id, "load", num_pending_blocks))
        assert not st.transfer_jobs, "a load is only issued with no job in flight"
        st.transfer_jobs.add(job_id)
        self.jobs[job_id] = JobStatus(request.request_id, keys, False)
        self.chunks_being_loaded.update(keys)
        st.num_loaded_tokens = num_external_tokens
        st.load_step = self.step
        self.stats.load_jobs += 1
        self.stats.blocks_loaded += num_pending_blocks

    # -- the step's metadata ------------------------------------------------------------------
    def build_connector_meta(self, output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, stores and flushes (see the module docstring, step 3)."""
        hpc, tpc = self.hashes_per_chunk, self.tokens_per_chunk
        allocated = self._batch_allocated
        status = self.req_status
        prompt_only = self.offload_prompt_only
        store_jobs: list[TransferJob] = []
        # vLLM updates every scheduled request (_update_req_states), then offers their chunks (_build_store_jobs);
        # one pass does both per request, in scheduled order: an offer reads only its own request's state and the
        # manager, and the flushes below read neither (only a finished request's store watches blocks: later)
        for s in output.scheduled:
            req = s.request
            st = status[req.request_id]
            st.update_offload_keys(hpc, tpc)
            admitted, new = s.admitted, s.new_blocks
            if admitted:  # the whole block table
                st.blocks.clear()
            if new:  # (the blocks themselves: their ids are read only where needed)
                st.blocks.extend(new)
                allocated.add_new(new)
            elif st.prompt_offered and not admitted:
                continue  # the test below held at an earlier step and still holds (prompt_offered)
            n_after = s.num_computed_before + s.num_new_tokens
            prompt = req.num_prompt_tokens
            st.prompt_offered = prompt_only and n_after >= prompt and st.next_stored_chunk_idx * tpc > prompt - tpc
            if st.prompt_offered:
                continue  # a decode whose prompt is all offered: build_store_job's fast path
            self.build_store_job(st, n_after, store_jobs)
        load_ids = {j.job_id for j in self._batch_load_jobs}
        flush = self._batch_jobs_to_flush
        for r in output.preempted:  # their in-flight jobs must land before the blocks are reused
            st_p = self.req_status.get(r.request_id)
            if st_p is not None:
                flush.update(st_p.transfer_jobs - load_ids)
        pending = self.block_id_to_pending_jobs
        if pending and not pending.keys().isdisjoint(allocated.ids()):
            flush.update(*[pending[bid] for bid in allocated.ids() if bid in pending])
        # NOTE: vLLM iterates the finished_req_ids *set* (an order that depends on str hashing);
        # here the requests go in the order they finished (deterministic; see coord notes)
        finished = self._finished_order
        for rid in finished:
            st_f = status.get(rid)
            if st_f is not None:
                self.build_store_job(st_f, -1, store_jobs)
        meta = KVConnectorMetadata(
            [
                TransferJob(j.job_id, j.request_id, j.kind, j.num_blocks, j.job_id in flush)
                for j in self._batch_load_jobs
            ],
            [TransferJob(j.job_id, j.request_id, j.kind, j.num_blocks, j.job_id in flush) for j in store_jobs],
            set(flush),
        )
        self._commit_finished()
        self._batch_load_jobs = []
        self._batch_jobs_to_flush = set()
        self._batch_allocated = StepAllocations()
        self.step += 1
        return meta

    def _commit_finished(self) -> None:
        """The requests finished since the last step made every offer: commit their accesses."""
        for rid in self._finished_order:
            st_f = self.req_status.get(rid)
            if st_f is None:
                continue
            st_f.finished_signaled = True
            self.manager.on_request_finished(st_f.ctx)
            if not st_f.transfer_jobs:
                del self.req_status[rid]
        self._finished_order = []

    def build_store_job(
        self,
        st: RequestOffloadState,
        num_tokens_after_batch: int,
        out: list[TransferJob],
        late_sources: list[tuple[int, RequestOffloadState, int, int, list[int]]] | None = None,
    ) -> None:
        """Offer one request's next chunks (vLLM ``_build_store_jobs``' loop body); ``num_tokens_after_batch``
        < 0 marks a finished request. With ``late_sources`` (a decode window's prefill: its new blocks are
        known once the window is played) a store job's ``(job id, state, first, end, chunk indices)`` is
        appended there for its source blocks -- the chunks ``[first, end)`` (all offered, or a partial
        offer's stored tail), or the listed indices (``sim.replay.tier_window``); its block count is its chunks'."""
        req = st.req
        req_id = req.request_id
        tpc, bpc = self.tokens_per_chunk, self.blocks_per_chunk
        if (
            self.offload_prompt_only
            and num_tokens_after_batch >= req.num_prompt_tokens
            and st.next_stored_chunk_idx * tpc > req.num_prompt_tokens - tpc
        ):
            # fast path (a decode): the offloadable tokens are the prompt, whose storable chunks
            # all lie before next_stored_chunk_idx -- vLLM's advance_stored_idx would change nothing
            return
        finished = req.status > PREEMPTED
        if finished:
            num_chunks = st.final_offer_end(self.tokens_per_chunk, self.blocks_per_chunk, self.offload_prompt_only)
        else:
            n = min(num_tokens_after_batch, req.num_tokens)
            if self.offload_prompt_only:
                n = min(n, req.num_prompt_tokens)
            # (a window's prefill: its blocks cover n, its block ids are not appended yet)
            num_chunks = st.storable_chunks(n, tpc, bpc) if late_sources is None else min(n // tpc, len(st.keys))
        start = st.next_stored_chunk_idx
        if num_chunks <= start:  # (vLLM's advance_stored_idx would change nothing)
            return
        new_keys = st.keys[start:num_chunks]
        result = self.manager.prepare_store(new_keys, st.ctx, start)
        if result is None:
            self.stats.allocation_failures += 1
            return
        if not result.keys_to_store:  # advance_stored_idx: past the chunks offered
            st.next_stored_chunk_idx = num_chunks
            return
        if self.events_tracker is not None:  # vLLM record_store in _build_store_jobs
            self.events_tracker.record_store(st, start, new_keys, result.keys_to_store)
        to_store = result.keys_to_store  # (a list of its own: the job keeps it)
        # the stored chunks: [first, num_chunks) -- every one offered (the usual case) or a partial
        # offer's tail -- or the listed indices (request_state.stored_run)
        first, chunk_ids = (start, []) if len(to_store) == len(new_keys) else stored_run(new_keys, to_store, start)
        # (no null block is a source: OffloadTier's one full-attention group never holds one)
        src: list[KVCacheBlock] = [] if late_sources is not None else chunk_blocks(
            st.blocks, first, num_chunks, chunk_ids, bpc)
        st.next_stored_chunk_idx = max(st.next_stored_chunk_idx, num_chunks)
        job_id = self._new_job_id()
        st.transfer_jobs.add(job_id)
        self.jobs[job_id] = JobStatus(req_id, to_store, True, src, result.chunks, first)
        num_blocks = len(src)
        if late_sources is not None:
            late_sources.append((job_id, st, first, num_chunks, chunk_ids))
            num_blocks = len(to_store) * bpc
        out.append(TransferJob(job_id, req_id, "store", num_blocks))
        self.stats.store_jobs += 1
        self.stats.blocks_stored += num_blocks
        if finished:  # its blocks are free now: watch them for re-allocation
            allocated = self._batch_allocated.ids()
            for b in src:
                bid = b.block_id
                self.block_id_to_pending_jobs.setdefault(bid, set()).add(job_id)
                if bid in allocated:
                    self._batch_jobs_to_flush.add(job_id)

    # -- worker output ------------------------------------------------------------------------
    def update_connector_output(self, out: KVConnectorOutput) -> None:
        """Complete the reported jobs (vLLM ``_update_connector_output``), in id order."""
        for job_id in sorted(out.completed_jobs):
            job = self.jobs.pop(job_id)
            st = self.req_status[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys, job.chunks)
            else:
                self.manager.complete_load(job.keys)
                self.chunks_being_loaded.difference_update(job.keys)
            if self.block_id_to_pending_jobs and st.req.status > PREEMPTED:
                self._unwatch(job_id, job.source_block_ids)
            st.transfer_jobs.remove(job_id)
            if st.finished_signaled and not st.transfer_jobs:
                del self.req_status[job.req_id]

    def _unwatch(self, job_id: int, block_ids: Iterable[int]) -> None:
        pending = self.block_id_to_pending_jobs
        for bid in block_ids:
            pending[bid].remove(job_id)
            if not pending[bid]:
                del pending[bid]

    def check_integrity(self) -> None:
        """Query: assert the jobs and request states agree (no null block held), and the manager's invariants."""
        self.manager.check_integrity()
        owned = {j for st in self.req_status.values() for j in st.transfer_jobs}
        assert owned == self.jobs.keys(), (owned, set(self.jobs))
        for st in self.req_status.values():
            kinds = {self.jobs[j].is_store for j in st.transfer_jobs}
            assert len(kinds) <= 1 and (kinds != {False} or len(st.transfer_jobs) == 1)
            assert all(b.block_id != 0 for b in st.blocks)
