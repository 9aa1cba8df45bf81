"""The oracle's stub offload worker (the worker half of vLLM 0.33.0's OffloadingConnector replaced
by a fixed delay, as ``tools/vllm_oracle`` runs it): every job carried by the metadata of executed
step ``s`` is reported in the output of step ``s + delay_steps``; a job the metadata flushes is
reported in the output of the step that flushes it (vLLM ``handle_preemptions`` waits for it); a
finished load reports its request in ``finished_recving`` together with its job id.

One ``execute`` call is one executed engine step, including steps that schedule no token (vLLM runs
the connector for them too). Invariants: every job is reported exactly once, never before the step
that carried it. Imports nothing from the project beyond this package.
"""

from __future__ import annotations

from sim.core.transfer_job import KVConnectorMetadata, KVConnectorOutput, TransferJob


class StepDelayWorker:
    """Reports each job ``delay_steps`` executed steps after the one that carried it."""

    def __init__(self, delay_steps: int = 1) -> None:
        if delay_steps < 1:  # a store of step s is submitted at the start of step s + 1 at the earliest
            raise ValueError(f"delay_steps must be >= 1, got {delay_steps}")
        self.delay_steps = delay_steps
        self.step = 0
        self.pending: dict[int, tuple[int, TransferJob]] = {}  # job id -> (due step, job)

    def execute(self, meta: KVConnectorMetadata | None) -> KVConnectorOutput:
        """Changes state: run one step's connector work; the jobs that complete in it."""
        step = self.step
        self.step += 1
        if meta is not None:
            for job in (*meta.load_jobs, *meta.store_jobs):
                self.pending[job.job_id] = (step + self.delay_steps, job)
            for job_id in meta.jobs_to_flush:
                if job_id in self.pending:
                    self.pending[job_id] = (step, self.pending[job_id][1])
        out = KVConnectorOutput()
        for job_id in sorted(self.pending):
            due, job = self.pending[job_id]
            if due <= step:
                del self.pending[job_id]
                out.completed_jobs.add(job_id)
                if job.kind == "load":
                    out.finished_recving.add(job.request_id)
        return out

    def has_pending(self) -> bool:
        """Query: jobs not reported yet."""
        return bool(self.pending)
