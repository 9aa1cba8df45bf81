"""A step-by-step driver of a :class:`~sim.core.scheduler.Scheduler` with an offload tier, as
``tools/vllm_oracle/oracle.py`` drives vLLM's (for agreement tests; the replay layer has its own
loops on the clock).

Fixed step time ``d``: at each step time t, add every request with ``arrival <= t`` (list order);
if the scheduler has requests, ``schedule()`` and execute the step (the stub worker sees its
metadata, the token plan gives each request that samples its token); sync: process that step's
output at once; async (two batches in flight, vLLM ``step_with_batch_queue``): process the oldest
batch once two are queued or nothing more can be scheduled. t advances by d after a step that
scheduled tokens; an empty step takes no time. When the engine is idle the next step starts at the
next arrival -- with an offload tier only once ``has_requests()`` is false (its jobs reported, its
finished requests committed), and after the last request finished it steps on until then, as the
oracle does. The
prefix-cache stats are drained after every processed output and summed. Imports nothing above
``sim.core``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.core.executor import planned_samples
from sim.core.offload.step_worker import StepDelayWorker
from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput
from sim.core.transfer_job import KVConnectorOutput

_EPS = 1e-9


@dataclass(slots=True)
class RequestOutcome:
    """What one request got: the first admission's GPU and CPU hits, its preemptions, the
    re-admissions' (GPU, CPU) hits, and the steps it spent waiting for KV loads."""

    hit_tokens: int | None = None
    external_hit_tokens: int = 0
    num_preemptions: int = 0
    readmit_hits: list[tuple[int, int]] = field(default_factory=list)
    steps_waiting_for_kv: int = 0
    first_scheduled_step: int | None = None
    finish_step: int | None = None


@dataclass(slots=True)
class DriveResult:
    """Per-request outcomes (by id) and engine totals."""

    requests: dict[str, RequestOutcome]
    total_steps: int
    total_preemptions: int
    prefix_cache: PrefixCacheStats


def drive(
    sched: Scheduler,
    requests: Sequence[tuple[float, Request]],
    step_time: float = 0.01,
    worker: StepDelayWorker | None = None,
    *,
    check: bool = True,
    max_steps: int = 1_000_000,
) -> DriveResult:
    """Changes state: run ``requests`` (arrival, request) through ``sched`` to the end; with
    ``check``, assert the scheduler's integrity after every step."""
    worker = worker if worker is not None else StepDelayWorker(1)
    is_async = sched.config.async_scheduling
    outcomes = {r.request_id: RequestOutcome() for _, r in requests}
    by_id = {r.request_id: r for _, r in requests}
    inflight: deque[tuple[SchedulerOutput, dict[str, list[int]], KVConnectorOutput]] = deque()
    nxt = 0
    t_base = requests[0][0] if requests else 0.0
    n = 0
    step = 0
    finished = 0
    stats = PrefixCacheStats()

    def more_work() -> bool:
        if finished < len(requests):
            return True
        return sched.tier is not None and (sched.has_requests() or bool(inflight))

    def process(out: SchedulerOutput, sampled: dict[str, list[int]], kv_out: KVConnectorOutput) -> None:
        nonlocal finished
        for r in sched.update_from_output(out, sampled, kv_out):
            outcomes[r.request_id].finish_step = step
            finished += 1
        st = sched.make_stats()
        if st is not None:
            stats.add(st)

    while more_work():
        t = t_base + n * step_time
        while nxt < len(requests) and requests[nxt][0] <= t + _EPS:
            sched.add_request(requests[nxt][1])
            nxt += 1
        out = None
        to_process = None
        if sched.has_requests():
            out = sched.schedule()
            kv_out = worker.execute(out.kv_connector_metadata)
            for s in out.scheduled:
                if s.admitted:
                    o = outcomes[s.request.request_id]
                    if o.hit_tokens is None:
                        o.hit_tokens, o.first_scheduled_step = s.hit_tokens, step
                        o.external_hit_tokens = s.external_hit_tokens
                    else:
                        o.readmit_hits.append((s.hit_tokens, s.external_hit_tokens))
            entry = (out, planned_samples(out), kv_out)
            if is_async:
                inflight.append(entry)
                if len(inflight) >= 2 or not (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
                    to_process = inflight.popleft()
            else:
                to_process = entry
        elif inflight:
            to_process = inflight.popleft()
        if to_process is not None:
            process(*to_process)
        if check:
            sched.check_integrity()
        if out is not None:
            step += 1
            if out.total_num_scheduled_tokens > 0:
                n += 1
        if step > max_steps:
            raise RuntimeError(f"more than {max_steps} steps")
        # idle -> the next step starts at the next arrival; with a tier the engine first steps
        # (free empty steps) until has_requests() is false: finished requests' last store pass and
        # policy commit, pending jobs (vLLM EngineCore keeps stepping while has_requests())
        busy = sched.has_requests() if sched.tier is not None else sched.has_unfinished_requests()
        if not busy and not inflight and nxt < len(requests):
            if requests[nxt][0] > t_base + n * step_time:
                t_base, n = requests[nxt][0], 0
    total_pre = 0
    for rid, o in outcomes.items():
        r = by_id[rid]
        o.num_preemptions = r.num_preemptions
        o.steps_waiting_for_kv = r.num_steps_waiting_for_kv
        total_pre += r.num_preemptions
    return DriveResult(outcomes, step, total_pre, stats)
