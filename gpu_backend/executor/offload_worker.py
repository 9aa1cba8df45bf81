"""The offload connector's worker on the real backend: the CPU tier's loads and stores as real block
copies, driven by the scheduler's connector metadata (mirrors vLLM 0.33.0's
``OffloadingConnectorWorker`` in ``distributed/kv_transfer/kv_connector/v1/offloading/worker.py``
over its ``CPUOffloadingWorker``, ``vllm/v1/kv_offload/cpu/gpu_worker.py``).

Per step, in vLLM's order (the simulated twin is ``sim.replay.kv_transfer.LinkKVWorker``):

1. ``handle_preemptions``: the previous step's stores and this step's ``jobs_to_flush`` stores go
   on the device->host queue; the host waits for every flushed job (their source blocks are
   re-allocated in this very step, so the forward must not overwrite them before they are read);
2. ``start_kv_transfers``: this step's loads go on the host->device queue;
3. the forward runs (the executor); on CUDA the copies run beside it on their own streams;
4. ``prepare_store_kv``: this step's other stores wait for the next step's start;
5. ``get_finished``: every job done by the step's end and due (never in the output of the step
   whose metadata carried it, except a flushed one) is reported -- ``completed_jobs`` and, for a
   load, its request in ``finished_recving``.

Addresses: the metadata names jobs, requests and block counts (``sim.core.transfer_job``); the
block ids come from the scheduler at the moment the metadata is handed over, as vLLM's metadata
carries them in its load/store specs (:class:`JobAddresses`): a store reads its job's
``source_block_ids`` into the CPU chunks its keys were given; a load writes the chunks of its keys,
less the sub-blocks the GPU already holds (``skip``: the local hit inside the first chunk), into
the request's blocks past its local hit.

When another clock reports the jobs (a replay's ``LinkKVWorker`` decides when the scheduler hears
of them), :meth:`TorchOffloadWorker.order_forward` keeps the copies safe on CUDA: the compute
stream waits for the load of a request admitted in this step and for an in-flight store whose
source blocks this step writes. On a CPU device every copy is done when submitted.

Invariants: every submitted job is reported once; jobs are resolved to addresses while the
connector still holds them. Imports torch (this package only).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpu_backend.executor.cpu_kv_store import CopyQueue, CPUKVStore, Transfer, device_tensors
from gpu_backend.layout.kv_cache import PagedKVCache
from sim.core.transfer_job import KVConnectorMetadata, KVConnectorOutput, TransferJob

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.scheduler import Scheduler
    from sim.core.scheduler_output import SchedulerOutput


@dataclass(frozen=True)
class CopySpec:
    """One job's addresses: GPU block ids and the CPU store's sub-block rows, pairwise."""

    gpu_block_ids: tuple[int, ...]
    cpu_rows: tuple[int, ...]
    skip: int = 0  # sub-blocks of the first CPU chunk left out (a load's local hit inside it)


class AddressBook(Protocol):
    """Where a job's blocks are (:class:`JobAddresses`; tests give a table)."""

    def of(self, job: TransferJob) -> CopySpec: ...


class JobAddresses:
    """The addresses of a job, read from the scheduler's connector (query only)."""

    def __init__(self, scheduler: Scheduler, store: CPUKVStore) -> None:
        if scheduler.tier is None:
            raise ValueError("the scheduler has no CPU offload tier")
        self.connector = scheduler.tier.connector
        self.kv_manager = scheduler.kv_cache_manager
        self.store = store
        if self.connector.blocks_per_chunk != store.blocks_per_chunk:
            raise ValueError("the CPU store and the connector disagree on blocks per chunk")

    def of(self, job: TransferJob) -> CopySpec:
        """Query: the addresses of ``job`` (the connector must still hold it)."""
        conn = self.connector
        status = conn.jobs[job.job_id]
        policy = conn.manager.policy
        chunk_ids = []
        for key in status.keys:
            chunk = policy.get(key)
            assert chunk is not None, f"job {job.job_id}: chunk {key!r} is not resident"
            chunk_ids.append(chunk.chunk_id)
        if status.is_store:
            gpu = tuple(status.source_block_ids)
            return CopySpec(gpu, tuple(self.store.sub_blocks(chunk_ids, 0, len(gpu))))
        st = conn.req_status[job.request_id]
        bs = conn.block_size
        load_start = -(-st.num_locally_computed_tokens // bs)
        gpu = tuple(self.kv_manager.get_block_ids(job.request_id)[load_start : load_start + job.num_blocks])
        skip = load_start % conn.blocks_per_chunk
        return CopySpec(gpu, tuple(self.store.sub_blocks(chunk_ids, skip, job.num_blocks)), skip)


@dataclass
class _Job:
    kind: str
    request_id: str
    spec: CopySpec
    first_report_step: int
    done: bool = False


@dataclass
class OffloadCounters:
    """What the worker moved, and the measured time of each transfer (kind, bytes, seconds)."""

    num_loads: int = 0
    num_stores: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    loads_with_skip: int = 0
    flushes: int = 0
    transfers: list[tuple[str, int, float]] = field(default_factory=list)


class TorchOffloadWorker:
    """The worker of one engine: a device->host and a host->device :class:`CopyQueue` between
    ``cache`` and ``store``, the jobs in flight, and the reports (see the module docstring)."""

    def __init__(self, cache: PagedKVCache, store: CPUKVStore, addresses: AddressBook) -> None:
        self.cache = cache
        self.store = store
        self.addresses = addresses
        self.stores = CopyQueue(device_tensors(cache), store.tensors, "dst")
        self.loads = CopyQueue(store.tensors, device_tensors(cache), "src")
        self.in_flight: dict[int, _Job] = {}
        self._deferred: list[tuple[int, _Job]] = []
        self.awaiting_admission: set[str] = set()  # loads' requests the runner does not hold yet
        self.counters = OffloadCounters()

    @classmethod
    def for_scheduler(cls, cache: PagedKVCache, scheduler: Scheduler) -> TorchOffloadWorker:
        """A worker with a CPU store of the scheduler's tier size (pinned on CUDA)."""
        if scheduler.tier is None:
            raise ValueError("the scheduler has no CPU offload tier")
        conn = scheduler.tier.connector
        store = CPUKVStore(cache, conn.manager.num_chunks, conn.blocks_per_chunk)
        return cls(cache, store, JobAddresses(scheduler, store))

    def has_pending(self) -> bool:
        """Query: a job submitted and not yet reported, or a store not yet submitted."""
        return bool(self.in_flight) or bool(self._deferred)

    def _submit(self, job_id: int, job: _Job) -> None:
        spec = job.spec
        c = self.counters
        if job.kind == "store":
            tr = self.stores.submit(job_id, spec.gpu_block_ids, spec.cpu_rows)
            c.num_stores += 1
            c.store_bytes += tr.num_bytes
        else:
            tr = self.loads.submit(job_id, spec.cpu_rows, spec.gpu_block_ids)
            c.num_loads += 1
            c.load_bytes += tr.num_bytes
            c.loads_with_skip += spec.skip > 0
        self.in_flight[job_id] = job

    def start_step(self, step: int, meta: KVConnectorMetadata | None) -> None:
        """Changes state: phases 1, 2 and 4 of ``step`` (before its forward)."""
        flush: Collection[int] = meta.jobs_to_flush if meta is not None else ()
        jobs: dict[int, _Job] = {}
        if meta is not None:  # resolved now, while the connector holds every job of the metadata
            for tj in (*meta.load_jobs, *meta.store_jobs):
                jobs[tj.job_id] = _Job(tj.kind, tj.request_id, self.addresses.of(tj), step + 1)
            for tj in meta.store_jobs:  # 1. a flushed store of this step goes with the deferred ones
                if tj.job_id in flush:
                    jobs[tj.job_id].first_report_step = step
                    self._deferred.append((tj.job_id, jobs[tj.job_id]))
        for job_id, job in self._deferred:
            self._submit(job_id, job)
        self._deferred = []
        if flush:
            self.counters.flushes += 1
            self.stores.wait(set(flush))
            for job_id in flush:
                f = self.in_flight.get(job_id)
                if f is not None:
                    f.first_report_step = step  # done within this step: reported in its output
        if meta is not None:
            for tj in meta.load_jobs:  # 2. start_kv_transfers
                self._submit(tj.job_id, jobs[tj.job_id])
                self.awaiting_admission.add(tj.request_id)
            for tj in meta.store_jobs:  # 4. prepare_store_kv: submitted at the next step's start
                if tj.job_id not in flush:
                    self._deferred.append((tj.job_id, jobs[tj.job_id]))

    def order_forward(self, output: SchedulerOutput) -> None:
        """Before the forward of ``output``: the runner now holds the admitted loads' requests; on
        CUDA the compute stream waits for their loads and for in-flight stores reading a block the
        forward writes (a no-op for copies already done)."""
        admitted = {s.request.request_id for s in output.scheduled if s.admitted}
        self.awaiting_admission -= admitted
        if self.loads.device is None or not self.in_flight:
            return
        written = {b for s in output.scheduled for b in s.new_block_ids}
        for job_id, job in self.in_flight.items():
            if job.done:
                continue
            if job.kind == "load" and job.request_id in admitted:
                self.loads.order_compute_after(job_id)
            elif job.kind == "store" and not written.isdisjoint(job.spec.gpu_block_ids):
                self.stores.order_compute_after(job_id)

    def finish_step(self, step: int) -> KVConnectorOutput:
        """Changes state: phase 5 at the end of ``step``: the jobs done and due, reported once."""
        done: list[tuple[str, Transfer]] = [("store", t) for t in self.stores.done()]
        done += [("load", t) for t in self.loads.done()]
        for kind, tr in done:
            self.in_flight[tr.job_id].done = True
            self.counters.transfers.append((kind, tr.num_bytes, tr.elapsed_s()))
        out = KVConnectorOutput()
        for job_id, job in list(self.in_flight.items()):
            if job.done and job.first_report_step <= step:
                del self.in_flight[job_id]
                out.completed_jobs.add(job_id)
                if job.kind == "load":
                    out.finished_recving.add(job.request_id)
        return out
