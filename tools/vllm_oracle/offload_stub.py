"""vLLM 0.33.0 native CPU offloading in the oracle: a stub worker and passive observers.

DEV-ONLY harness code (no vLLM source is copied; vLLM objects are only built and watched).

The scheduler side is vLLM's own ``OffloadingConnector`` (role SCHEDULER) over its
``CPUOffloadingManager`` (LRU or ARC).  No worker process exists, so this module plays the worker:

``StubWorker`` turns every step's ``OffloadingConnectorMetadata`` into the ``KVConnectorOutput`` a
real ``OffloadingConnectorWorker`` (``offloading/worker.py``) would return, with transfers that take
a fixed number of engine steps instead of bytes over a link.  Timing, for the metadata of batch
(= ``schedule()`` call) ``b`` and ``K = delay_steps``:

* a load job (``meta.load_jobs``, async) and a store job (``meta.store_jobs``) are reported in the
  ``KVConnectorOutput`` of batch ``b + K``: ``completed_jobs[job] = 1`` in
  ``kv_connector_worker_meta`` (an ``OffloadingWorkerMetadata``), and for an async load also its
  request id in ``finished_recving``.  (A real worker submits a store of batch ``b`` at the start
  of batch ``b + 1``, ``OW.prepare_store_kv`` / ``start_kv_transfers``, so ``K = 1`` is "the store
  finishes in the step it is submitted".)  A sync load (``TransferJob.sync``; only with
  ``sync_load_budget_bytes`` > 0) is reported in batch ``b`` itself, as ``OW.start_kv_transfers``
  waits for it.
* a job in ``meta.jobs_to_flush`` of batch ``b`` (stores of a request preempted in ``b``, stores of
  finished requests whose source GPU block is re-allocated in ``b``) is reported in batch ``b``
  (``OW.handle_preemptions`` submits and waits for it before the forward), unless it was already
  due at or before ``b`` (then it keeps that batch: a real worker reports a job once).
* every batch, empty ones included, is a worker step (``GPUModelRunner`` runs
  ``kv_connector_no_forward`` for a batch without tokens), so the engine has to keep calling
  ``schedule()`` while jobs are pending; vLLM's ``Scheduler.has_requests()`` says so through
  ``connector.has_pending_push_work()``.

``OffloadObserver`` wraps a few connector / manager methods (record the call, return the result
unchanged) to count what the CPU tier did: chunks stored and loaded, jobs, evictions, allocation
failures, and per-request external hits.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StubWorker:
    delay_steps: int = 1
    # job id -> the batch whose output reports it
    due: dict[int, int] = field(default_factory=dict)
    by_batch: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    # async load job id -> request id (finished_recving)
    load_req: dict[int, str] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)

    def _set_due(self, job_id: int, batch: int) -> None:
        old = self.due.get(job_id)
        if old is not None:
            self.by_batch[old].discard(job_id)
        self.due[job_id] = batch
        self.by_batch[batch].add(job_id)

    def submit(self, batch: int, meta: Any) -> dict:
        """Register the jobs of batch ``batch``'s metadata (called right after its schedule())."""
        k = self.delay_steps
        ev: dict[str, Any] = {"loads": [], "stores": [], "flush": []}
        for job_id, job in meta.load_jobs.items():
            self.kinds[job_id] = "load"
            if job.sync:
                self._set_due(job_id, batch)
            else:
                self.load_req[job_id] = job.req_id
                self._set_due(job_id, batch + k)
            ev["loads"].append(job_id)
        for job_id in meta.store_jobs:
            self.kinds[job_id] = "store"
            self._set_due(job_id, batch + k)
            ev["stores"].append(job_id)
        for job_id in sorted(meta.jobs_to_flush or ()):
            d = self.due.get(job_id)
            if d is not None and d > batch:
                self._set_due(job_id, batch)
            ev["flush"].append(job_id)
        return ev

    def pending(self) -> bool:
        return bool(self.due)

    def report(self, batch: int, KVConnectorOutput: Any, OffloadingWorkerMetadata: Any):
        """The KVConnectorOutput of batch ``batch`` (called when its output is processed)."""
        jobs = sorted(self.by_batch.pop(batch, ()))
        recving: set[str] = set()
        for job_id in jobs:
            del self.due[job_id]
            rid = self.load_req.pop(job_id, None)
            if rid is not None:
                recving.add(rid)
        meta = None
        if jobs:
            meta = OffloadingWorkerMetadata(completed_jobs={j: 1 for j in jobs})
        out = KVConnectorOutput(finished_sending=set(), finished_recving=recving,
                                kv_connector_worker_meta=meta)
        return out, jobs, sorted(recving)


@dataclass
class TierCounters:
    store_offers: int = 0          # prepare_store calls
    store_jobs: int = 0
    stored_chunks: int = 0         # keys inserted by prepare_store (to be written)
    store_reused_chunks: int = 0   # offered keys already resident and ready
    completed_store_chunks: int = 0
    load_jobs: int = 0
    loaded_chunks: int = 0         # keys pinned by prepare_load
    evicted_chunks: int = 0
    allocation_failures: int = 0   # prepare_store returned None
    lookups_deferred: int = 0      # get_num_new_matched_tokens returned None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _OrderedIdSet(set):
    """A set of request ids that iterates in a given order (the only thing the connector does
    with ``scheduler_output.finished_req_ids`` besides truthiness is iterating it)."""

    def __init__(self, ids: list[str]):
        super().__init__(ids)
        self._order = ids

    def __iter__(self):
        return iter(self._order)


def fix_finished_order(sched: Any, mode: str) -> None:
    """Make the connector see ``scheduler_output.finished_req_ids`` in a reproducible order.

    vLLM 0.33.0 iterates that ``set[str]`` in ``OffloadingConnectorScheduler._build_connector_meta``
    (``manager.on_request_finished`` per finished request: the policy commit that re-ranks its
    keys) and in ``_build_store_jobs`` (the finished requests' last store offers). Set iteration
    order of strings follows the interpreter's hash seed (PYTHONHASHSEED), so with two or more
    requests finishing in one step vLLM's own LRU/ARC order -- and then evictions and hits --
    changes from process to process (measured: 4 seeds, 4 different results on a 221-request
    Mooncake slice). ``mode``:
      "finish": the order the Scheduler freed them (``Scheduler._free_request`` calls: the order of
                ``update_from_output``'s request loop, i.e. the batch order), the default;
      "sorted": by request id;
      "set":    vLLM unchanged (reproducible only with PYTHONHASHSEED set for the process).
    """
    if mode == "set":
        return
    conn = sched.connector
    freed: list[str] = []
    orig_free = sched._free_request

    def _free_request(request, *a, **kw):
        freed.append(request.request_id)
        return orig_free(request, *a, **kw)
    sched._free_request = _free_request

    orig_build = conn.build_connector_meta

    def build_connector_meta(scheduler_output):
        fin = scheduler_output.finished_req_ids
        if not fin or len(fin) < 2:
            freed[:] = [r for r in freed if r not in (fin or ())]
            return orig_build(scheduler_output)
        if mode == "sorted":
            order = sorted(fin)
        else:
            order = [r for r in freed if r in fin]
            order += sorted(r for r in fin if r not in set(order))
        freed[:] = [r for r in freed if r not in fin]
        scheduler_output.finished_req_ids = _OrderedIdSet(order)
        try:
            return orig_build(scheduler_output)
        finally:
            scheduler_output.finished_req_ids = fin
    conn.build_connector_meta = build_connector_meta


class OffloadObserver:
    """Passive wrappers on the OffloadingConnector's scheduler side and its manager."""

    def __init__(self, connector: Any):
        self.connector = connector
        self.osched = connector.connector_scheduler
        self.manager = self.osched.manager
        self.c = TierCounters()
        # request id -> external tokens of the latest update_state_after_alloc
        self.last_external: dict[str, int] = {}
        # request id -> number of lookups the connector deferred (returned None)
        self.deferred: dict[str, int] = defaultdict(int)
        self._wrap()

    def _wrap(self) -> None:
        conn, mgr, c = self.connector, self.manager, self.c
        orig_match = conn.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens):
            n, is_async = orig_match(request, num_computed_tokens)
            if n is None:
                c.lookups_deferred += 1
                self.deferred[request.request_id] += 1
            return n, is_async
        conn.get_num_new_matched_tokens = get_num_new_matched_tokens

        orig_alloc = conn.update_state_after_alloc

        def update_state_after_alloc(request, blocks, num_external_tokens):
            self.last_external[request.request_id] = num_external_tokens
            return orig_alloc(request, blocks, num_external_tokens)
        conn.update_state_after_alloc = update_state_after_alloc

        orig_store = mgr.prepare_store

        def prepare_store(keys, req_context):
            keys = list(keys)
            ready = 0
            for k in keys:
                ch = mgr._policy.get(k)
                ready += ch is not None and ch.is_ready
            out = orig_store(keys, req_context)
            c.store_reused_chunks += ready
            c.store_offers += 1
            if out is None:
                c.allocation_failures += 1
            else:
                n = len(out.keys_to_store)
                c.stored_chunks += n
                c.store_jobs += 1 if n else 0
                c.evicted_chunks += len(out.evicted_keys)
            return out
        mgr.prepare_store = prepare_store

        orig_load = mgr.prepare_load

        def prepare_load(keys, req_context):
            keys = list(keys)
            c.load_jobs += 1
            c.loaded_chunks += len(keys)
            return orig_load(keys, req_context)
        mgr.prepare_load = prepare_load

        orig_complete = mgr.complete_store

        def complete_store(keys, req_context, success=True):
            keys = list(keys)
            c.completed_store_chunks += len(keys)
            return orig_complete(keys, req_context, success)
        mgr.complete_store = complete_store

    def job_chunks(self, job_id: int) -> int:
        st = self.osched._jobs.get(job_id)
        return len(st.keys) if st is not None else -1

    def final_state(self) -> dict:
        mgr = self.manager
        num_chunks = mgr._num_chunks
        resident = mgr._num_allocated_chunks - len(mgr._free_list)
        non_evictable = resident - mgr._num_evictable_cache_chunks
        return dict(
            num_chunks=num_chunks,
            resident_chunks=resident,
            write_pending_chunks=mgr._num_write_pending_chunks,
            # vLLM's gauge vllm:kv_offload_cpu_cache_usage (MGR.get_stats): the pinned or
            # still-being-written fraction, not the resident fraction
            vllm_cpu_cache_usage=(non_evictable / num_chunks) if num_chunks else 0.0,
            resident_fraction=(resident / num_chunks) if num_chunks else 0.0,
        )
