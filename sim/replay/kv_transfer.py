"""The CPU offload tier's worker side on the replay clock: when each load and store the connector
plans crosses the GPU<->CPU link, and in which step's output its completion is reported.

Mirrors the worker half of vLLM 0.33.0's OffloadingConnector (``OffloadingConnectorWorker`` in
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py``), step by step:

1. ``handle_preemptions`` -- at the step's start, before its forward: the previous step's stores
   (deferred by ``prepare_store_kv``) and this step's ``jobs_to_flush`` are submitted, and the
   forward waits until every flushed job is done (``worker.wait``);
2. ``start_kv_transfers`` -- this step's loads are submitted (after that wait);
3. the forward runs (the executor's duration);
4. ``prepare_store_kv`` -- this step's other stores are queued, to be submitted at the next step's
   start ("so that offloading starts AFTER transfers related to token sampling");
5. ``get_finished`` / ``build_connector_worker_meta`` -- the step's output reports every job done
   by the step's end: ``completed_jobs``, and ``finished_recving`` for the requests whose load is done.

A job is never reported before the output of the step after the one whose metadata carried it
(a flushed job: in the step that flushed it), as vLLM reports a transfer (issue 33: "never before the
next step's output"). So with a link fast enough for every transfer to land within a step, each job
is reported exactly one step later: the oracle's stub worker with ``--transfer-delay-steps 1``.

A step that schedules nothing runs no forward pass, but the engine keeps stepping while transfers
are pending (vLLM's ``has_pending_push_work``): such a step lasts until the first pending job that
it may report is done (the engine polls until then), or no time when none may be reported yet --
and no longer than until the next arrival, which the engine's next poll step would schedule
(``sim.replay.step_runner.empty_step_end``, the cap applied to every worker).
A job counts as done by a step's end to 1 ns (``ARRIVAL_EPS_S``, the clock's tolerance for "at the
same time"), so the jobs a fast link lands together are reported together.

Invariants: every submitted job is reported exactly once; ``in_flight`` holds the jobs submitted
and not yet reported; completion times come from one :class:`~sim.timing.transfer_link.TransferLink`
(a lane per direction by default, as vLLM's worker has a handler per direction: loads never wait for
stores; one shared lane with ``engine.offload_link_duplex: false``).
Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sim.core.transfer_job import KVConnectorOutput
from sim.replay.intake import ARRIVAL_EPS_S
from sim.timing.transfer_link import TransferLink


class TransferJobLike(Protocol):
    """One planned transfer (``sim.core.offload.transfer.TransferJob``): its id, request and the GPU
    blocks it moves."""

    @property
    def job_id(self) -> int: ...
    @property
    def request_id(self) -> str: ...
    @property
    def num_blocks(self) -> int: ...


class ConnectorMetadataLike(Protocol):
    """One step's connector metadata: vLLM's ``OffloadingConnectorMetadata`` fields
    (``sim.core.offload.transfer.KVConnectorMetadata``)."""

    @property
    def load_jobs(self) -> Sequence[TransferJobLike]: ...
    @property
    def store_jobs(self) -> Sequence[TransferJobLike]: ...
    @property
    def jobs_to_flush(self) -> set[int] | frozenset[int]: ...


@dataclass(slots=True)
class _InFlight:
    done_at: float
    first_report_step: int
    load_request_id: str | None  # a load's request (finished_recving), None for a store


@dataclass(slots=True)
class LinkKVWorker:
    """The connector's worker over one link; ``bytes_per_block`` is the model's KV bytes of one GPU
    block over all layers (the engine description's ``kv_bytes_per_block``)."""

    link: TransferLink
    bytes_per_block: int
    in_flight: dict[int, _InFlight] = field(default_factory=dict)
    _deferred_stores: list[tuple[int, TransferJobLike, int]] = field(default_factory=list)
    num_loads: int = 0
    num_stores: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    flush_wait_s: float = 0.0

    def has_pending(self) -> bool:
        """Query: a job submitted and not yet reported, or a store not yet submitted."""
        return bool(self.in_flight) or bool(self._deferred_stores)

    def next_done_at(self) -> float:
        """Query: the first in-flight job's done time (inf: none; -inf while a store waits to be
        submitted). A step with no new job whose end + ``ARRIVAL_EPS_S`` is before it submits and
        reports nothing: ``start_step`` and ``finish_step`` would change nothing."""
        if self._deferred_stores:
            return float("-inf")
        if not self.in_flight:
            return float("inf")
        return min([f.done_at for f in self.in_flight.values()])

    def _submit(self, job_id: int, job: TransferJobLike, now: float, first_report: int, load: bool) -> None:
        nbytes = job.num_blocks * self.bytes_per_block
        if load:
            self.num_loads += 1
            self.load_bytes += nbytes
        else:
            self.num_stores += 1
            self.store_bytes += nbytes
        done = self.link.submit(now, nbytes, load=load)
        self.in_flight[job_id] = _InFlight(done, first_report, job.request_id if load else None)

    def start_step(self, step: int, now: float, meta: ConnectorMetadataLike | None) -> float:
        """Changes state: phases 1-2 at the start of ``step`` (at ``now``); returns the seconds the
        step's forward waits for its flushed jobs."""
        flush = meta.jobs_to_flush if meta is not None else ()
        # 1. handle_preemptions: this step's flushed stores join the deferred ones, all submitted now
        if meta is not None and flush:
            for job in meta.store_jobs:
                if job.job_id in flush:
                    self._deferred_stores.append((job.job_id, job, step))
        for job_id, job, first_report in self._deferred_stores:
            self._submit(job_id, job, now, first_report, load=False)
        self._deferred_stores.clear()
        wait = 0.0
        for job_id in flush:
            f = self.in_flight.get(job_id)
            if f is not None:  # (a flushed job already reported needs no wait)
                wait = max(wait, f.done_at - now)
                f.first_report_step = step  # done within this step: reported in its output
        self.flush_wait_s += wait
        if meta is not None:
            # 2. start_kv_transfers: loads go on the link after the flush (reported from the next step on)
            for job in meta.load_jobs:
                self._submit(job.job_id, job, now + wait, step + 1, load=True)
            # 4. prepare_store_kv: the other stores wait for the next step's start
            for job in meta.store_jobs:
                if job.job_id not in flush:
                    self._deferred_stores.append((job.job_id, job, step + 1))
        return wait

    def idle_until(self, step: int, now: float) -> float:
        """Query: when an empty ``step`` starting at ``now`` ends -- when the first job it may report
        is done, ``now`` if one already is or none may be reported in this step."""
        due = [f.done_at for f in self.in_flight.values() if f.first_report_step <= step]
        first = min(due) if due else now
        return first if first > now else now

    def finish_step(self, step: int, end: float) -> KVConnectorOutput:
        """Changes state: phase 5 at the end of ``step`` (at ``end``): the jobs it reports."""
        completed: set[int] = set()
        recving: set[str] = set()
        for job_id, f in self.in_flight.items():
            if f.first_report_step <= step and f.done_at <= end + ARRIVAL_EPS_S:
                completed.add(job_id)
                if f.load_request_id is not None:
                    recving.add(f.load_request_id)
        for job_id in completed:
            del self.in_flight[job_id]
        return KVConnectorOutput(recving, completed)
