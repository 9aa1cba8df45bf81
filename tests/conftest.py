"""Shared helpers for the core test suite: build a scheduler, build requests, drive steps.

The helpers are plain functions (tests import them with ``from conftest import ...``) plus thin
fixtures. ``drive`` is the plain, deterministic test driver -- no time, no SimPy: at step ``k`` it
adds the requests that arrive at ``k``, calls ``schedule()``, samples one token for every request
whose prefill completes in the step (the request's planned token), calls ``update_from_output``,
drains ``make_stats()`` and runs ``check_integrity()`` -- after **every** step.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings

# The suite is the landing gate, so every run tries the same examples (each property's own seed):
# a rare case found by a random search fails someone's exploring run, not an unrelated landing, and
# once found it is pinned with @example. HYPOTHESIS_PROFILE=explore searches afresh on every run.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, _ROOT)

from sim.core.config import CacheConfig, SchedulerConfig  # noqa: E402
from sim.core.hashing import BlockHasher, make_block_hasher  # noqa: E402
from sim.core.kv_events import KVCacheEvent  # noqa: E402
from sim.core.prefix_cache_stats import PrefixCacheStats  # noqa: E402
from sim.core.request import Request  # noqa: E402
from sim.core.scheduler import Scheduler  # noqa: E402
from sim.core.scheduler_output import SchedulerOutput  # noqa: E402

_CACHE_KEYS = {"enable_prefix_caching", "use_eagle", "kv_groups", "pool_impl"}


class EventLog(list):
    """A KV-event sink that keeps every event (``log.of(BlockRemoved)`` filters by type)."""

    def __call__(self, event: KVCacheEvent) -> None:
        self.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self if isinstance(e, kind)]


def make_scheduler(
    num_blocks: int,
    block_size: int = 16,
    algo: str = "sha256",
    *,
    events: bool = False,
    log_stats: bool = True,
    hash_seed: int | str = 0,
    **kwargs,
) -> Scheduler:
    """A sync scheduler over ``num_blocks`` GPU blocks (block 0 is the null block, so
    ``num_blocks - 1`` are usable). ``kwargs`` go to :class:`SchedulerConfig`, except
    ``enable_prefix_caching`` / ``use_eagle`` / ``kv_groups`` / ``pool_impl`` which go to
    :class:`CacheConfig`. With ``events=True`` the scheduler gets an :class:`EventLog` sink,
    reachable as ``scheduler.event_sink``."""
    cache_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _CACHE_KEYS}
    hasher = make_block_hasher(algo, block_size, hash_seed)
    sink = EventLog() if events else None
    sched = Scheduler(
        SchedulerConfig(**kwargs),
        CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks, **cache_kw),
        hasher,
        log_stats=log_stats,
        event_sink=sink,
    )
    return sched


_uids = itertools.count(1)


def make_request(
    hasher: Scheduler | BlockHasher | None,
    request_id: str,
    prompt: Sequence[int],
    max_tokens: int = 1,
    **kwargs,
) -> Request:
    """A request hashed with the scheduler's (or the given) hasher and a fresh unique ``uid``."""
    if isinstance(hasher, Scheduler):
        hasher = hasher.hasher
    kwargs.setdefault("uid", next(_uids))
    return Request(request_id, list(prompt), max_tokens, hasher=hasher, **kwargs)


def toks(n: int, start: int = 0) -> list[int]:
    """``n`` distinct token ids ``start, start+1, ...`` (different ``start`` -> different prompts)."""
    return list(range(start, start + n))


def sum_stats(parts: Iterable[PrefixCacheStats | None]) -> PrefixCacheStats:
    total = PrefixCacheStats()
    for p in parts:
        if p is not None:
            total.add(p)
    return total


def stats_tuple(s: PrefixCacheStats) -> tuple[int, int, int, int, int, int]:
    """(requests, queries, hits, preempted_requests, preempted_queries, preempted_hits)."""
    return (s.requests, s.queries, s.hits, s.preempted_requests, s.preempted_queries, s.preempted_hits)


@dataclass
class StepLog:
    """What happened in one step of :func:`drive`."""

    step: int
    output: SchedulerOutput
    scheduled: dict[str, int]  # request id -> tokens scheduled, in output order
    admitted: dict[str, int]  # request id -> hit tokens, for requests admitted (or resumed) here
    preempted: list[str]
    finished: list[str]
    stats: PrefixCacheStats  # drained by make_stats() after this step (zeros if log_stats off)
    free_block_ids: list[int]  # free queue after the step, head first


@dataclass
class DriveResult:
    first_hits: dict[str, int] = field(default_factory=dict)  # hit tokens at first admission
    admissions: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    """request id -> [(step, hit_tokens, num_tokens at lookup), ...] for every (re)admission."""
    steps: list[StepLog] = field(default_factory=list)
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    finished: dict[str, Request] = field(default_factory=dict)
    requests: dict[str, Request] = field(default_factory=dict)

    def step(self, k: int) -> StepLog:
        return self.steps[k]

    def admitted_step(self, rid: str) -> int:
        return self.admissions[rid][0][0]

    @property
    def unfinished(self) -> list[str]:
        return [rid for rid in self.requests if rid not in self.finished]


def drive(
    scheduler: Scheduler,
    arrivals_by_step: Mapping[int, Iterable[Request]] | Iterable[Request],
    *,
    max_steps: int = 10_000,
    until_idle: bool = True,
    after_step: Callable[[StepLog, Scheduler], None] | None = None,
    check: bool = True,
) -> DriveResult:
    """Run the scheduler step by step (see the module docstring).

    ``arrivals_by_step`` maps a step index to the requests added just before that step's
    ``schedule()``; a plain iterable means "all at step 0". Stops after ``max_steps`` steps, or
    (``until_idle``) once every request has arrived and finished. ``after_step(log, scheduler)``
    runs after each step's checks; it may add assertions or poke the scheduler.
    """
    if not isinstance(arrivals_by_step, Mapping):
        arrivals_by_step = {0: list(arrivals_by_step)}
    arrivals = {k: list(v) for k, v in arrivals_by_step.items()}
    last_arrival = max(arrivals, default=-1)
    res = DriveResult()
    for k in range(max_steps):
        for r in arrivals.get(k, ()):
            scheduler.add_request(r)
            res.requests[r.request_id] = r
        out = scheduler.schedule()
        sampled: dict[str, list[int]] = {}
        admitted: dict[str, int] = {}
        for s in out.scheduled:
            r = s.request
            if s.admitted:
                admitted[r.request_id] = s.hit_tokens
                res.admissions.setdefault(r.request_id, []).append((k, s.hit_tokens, r.num_tokens))
                res.first_hits.setdefault(r.request_id, s.hit_tokens)
            if s.samples:
                sampled[r.request_id] = [r.planned_output_token(len(r.output_token_ids))]
        finished = scheduler.update_from_output(out, sampled)
        for r in finished:
            res.finished[r.request_id] = r
        stats = scheduler.make_stats() or PrefixCacheStats()
        res.stats.add(stats)
        if check:
            scheduler.check_integrity()
        log = StepLog(
            step=k,
            output=out,
            scheduled={s.request.request_id: s.num_new_tokens for s in out.scheduled},
            admitted=admitted,
            preempted=[r.request_id for r in out.preempted],
            finished=[r.request_id for r in finished],
            stats=stats,
            free_block_ids=scheduler.kv_cache_manager.block_pool.free_block_ids(),
        )
        res.steps.append(log)
        if after_step is not None:
            after_step(log, scheduler)
        if until_idle and k >= last_arrival and not scheduler.has_unfinished_requests():
            break
    return res


@pytest.fixture
def scheduler_factory():
    return make_scheduler


@pytest.fixture
def request_factory():
    return make_request


# -- the torch backend's fixtures (tests/test_gpu_backend_*.py); torch is imported only when used ----
@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny kernels run fastest on one thread (and do not fight other processes for cores); a module
    requests it with ``pytestmark = pytest.mark.usefixtures("torch_one_thread")``."""
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model(torch_one_thread):
    """The tiny fp32 CPU model of the torch backend, seed 0."""
    torch = pytest.importorskip("torch")
    from gpu_backend.executor.model import LlamaModel
    from gpu_backend.layout.shapes import TINY

    return LlamaModel(TINY, dtype=torch.float32, device="cpu", seed=0)
