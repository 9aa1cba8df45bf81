"""Correctness with the CPU offload tier: a prefix loaded back from the CPU store gives the same logits
as a dense recompute (reuse equals recompute, for vLLM 0.33.0's native offloading on the real backend).

The sim ``Scheduler`` with an offload tier (vLLM 0.33.0's profile, ``OffloadConfig``) drives a
:class:`~gpu_backend.executor.executor.TorchExecutor` whose
:class:`~gpu_backend.executor.offload_worker.TorchOffloadWorker`
copies blocks between the NaN-poisoned paged cache and a CPU store; the worker's own reports
(``completed_jobs``, ``finished_recving``) go back to ``update_from_output``, as vLLM's worker
output does. Block tables are checked after every step (requests waiting for their load excepted),
the scheduler's integrity too. A load that copied the wrong chunk, into the wrong block, or skipped
the wrong sub-blocks leaves NaN or another prefix's K/V in the blocks the request reads, and the
comparison fails. Cases (:data:`OFFLOAD_CASES`):

* ``cpu_load``: a request's prefix is evicted from the GPU by another request and comes back from
  the CPU tier (GPU hit 1 block + CPU hit 1 block, the probe in ``tests/test_offload_scheduler``);
* ``cpu_load_chunks``: chunks of 2 blocks, the GPU hit ending inside a chunk (a load with a skip);
* ``cpu_random``: seeded random workloads over a GPU pool of 11 usable blocks and a CPU tier of 10
  chunks, LRU for even seeds and ARC for odd ones (loads, stores, evictions in both tiers,
  preemptions and their flushes);
* the negative control ``corrupt_cpu_chunk`` (:data:`OFFLOAD_NEGATIVE`): the loaded chunk is
  corrupted in the CPU store before the load; the comparison must FAIL.

Imports torch (this package only).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from gpu_backend.attention import Attention, ReferenceAttention, SplitAttention
from gpu_backend.executor.executor import TorchExecutor
from gpu_backend.executor.model import LlamaModel
from gpu_backend.executor.offload_worker import TorchOffloadWorker
from gpu_backend.layout.kv_cache import PagedKVCache
from gpu_backend.validation.cases import Admission, CaseResult, Harness, _outs, _toks
from sim.core.config import CacheConfig, OffloadConfig, SchedulerConfig
from sim.core.hashing import make_block_hasher
from sim.core.request import Request
from sim.core.scheduler import Scheduler
from sim.core.scheduler_output import SchedulerOutput
from sim.core.version_profile import V0_33_0


class OffloadHarness(Harness):
    """:class:`~gpu_backend.validation.cases.Harness` over a scheduler with a CPU tier and a copying worker."""

    def __init__(self, model: LlamaModel, attention: Attention | None = None, *, num_blocks: int = 9,
                 block_size: int = 16, num_cpu_chunks: int = 64, blocks_per_chunk: int = 1, policy: str = "lru",
                 fill: float = float("nan"), **sched_kwargs: Any) -> None:
        sched_kwargs.setdefault("max_model_len", 1024)
        sched_kwargs.setdefault("max_num_batched_tokens", 256)
        sched_kwargs.setdefault("max_num_seqs", 16)
        self.model = model
        offload = OffloadConfig(num_cpu_chunks, blocks_per_chunk=blocks_per_chunk, policy=policy)  # type: ignore[arg-type]
        self.scheduler = Scheduler(SchedulerConfig(profile=V0_33_0, **sched_kwargs),
                                   CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks, offload=offload),
                                   make_block_hasher("sha256", block_size, 0))
        self.cache = PagedKVCache(model.spec.num_layers, num_blocks, block_size, model.num_kv_heads, model.head_dim,
                                  dtype=model.dtype, device=model.device, fill=fill)
        self.worker = TorchOffloadWorker.for_scheduler(self.cache, self.scheduler)
        if attention is None:
            ref = ReferenceAttention()
            attention = SplitAttention(ref, ref)
        self.executor = TorchExecutor(model, self.cache, attention, verify_with=self.scheduler.kv_cache_manager,
                                      keep_logits=True, offload=self.worker)
        self.requests = {}
        self.admissions = []
        self.preempted = []
        self.mixed_steps = 0
        self.partial_chunks = {}
        self.steps = 0
        self._uid = itertools.count(1)
        self.external_hits: dict[str, int] = {}

    # Harness.run steps it: ``schedule()``, the executor (copies + forward), ``update_from_output``
    # with the worker's report, until every request finished and every job was reported.
    def _idle(self) -> bool:
        """Query: no request left and no job the worker has not reported."""
        return not self.scheduler.has_requests() and not self.worker.has_pending()

    def _note_scheduled(self, k: int, out: SchedulerOutput) -> None:
        """Changes state: step ``k``'s admissions and external hits (a step may wait on loads: empty is fine)."""
        for s in out.scheduled:
            if s.admitted:
                r = s.request
                self.admissions.append(Admission(k, r.request_id, s.hit_tokens, list(s.new_block_ids),
                                                 r.num_preemptions > 0))
                self.external_hits[r.request_id] = self.external_hits.get(r.request_id, 0) + s.external_hit_tokens

    def facts(self, res: CaseResult) -> CaseResult:
        c = self.worker.counters
        res.facts.update(loads=c.num_loads, stores=c.num_stores, loads_with_skip=c.loads_with_skip,
                         flushes=c.flushes, external_hits=dict(self.external_hits),
                         cpu_evictions=self.scheduler.tier.connector.manager.stats.chunks_evicted
                         if self.scheduler.tier is not None else 0)
        return res


def _evict_and_reload(h: OffloadHarness, prompt_len: int, filler_len: int,
                      hooks: dict[int, Callable[[Harness], None]] | None = None) -> None:
    """``a`` computes a prefix; ``c`` (a different prompt) evicts most of it from the GPU; ``b``
    (``a``'s prefix plus its own tail) then finds the rest in the CPU tier."""
    prefix = _toks(21, prompt_len)
    a = h.request("a", prefix, 2, outputs=_outs(21, 2))
    c = h.request("c", _toks(22, filler_len), 2, outputs=_outs(22, 2))
    b = h.request("b", np.concatenate([prefix, _toks(23, 3)]), 3, outputs=_outs(23, 3))
    h.run({0: [a], 4: [c], 9: [b]}, hooks=hooks)


def case_cpu_load(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = OffloadHarness(model, attention, **hk)
    _evict_and_reload(h, 40, 100)
    res = h.facts(h.compare("cpu_load"))
    res.facts["ok_scenario"] = h.external_hits.get("b", 0) > 0 and h.worker.counters.num_loads >= 1
    return res


def case_cpu_load_chunks(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    h = OffloadHarness(model, attention, num_blocks=10, blocks_per_chunk=2, **hk)
    _evict_and_reload(h, 80, 120)
    res = h.facts(h.compare("cpu_load_chunks"))
    res.facts["ok_scenario"] = h.external_hits.get("b", 0) > 0 and h.worker.counters.loads_with_skip >= 1
    return res


def case_cpu_random(model: LlamaModel, attention: Attention | None = None, *, seed: int = 0,
                    num_requests: int = 24, **hk: Any) -> CaseResult:
    rng = np.random.default_rng(seed)
    hk.setdefault("num_blocks", 12)
    hk.setdefault("num_cpu_chunks", 10)
    h = OffloadHarness(model, attention, max_model_len=256,
                       max_num_batched_tokens=64, max_num_seqs=6, policy="arc" if seed % 2 else "lru", **hk)
    prefixes = [_toks(300 + seed * 10 + i, int(rng.integers(20, 70))) for i in range(3)]
    arrivals: dict[int, list[Request]] = {}
    step = 0
    for i in range(num_requests):
        p = prefixes[int(rng.integers(0, 3))]
        prompt = np.concatenate([p, _toks(400 + seed * 100 + i, int(rng.integers(1, 30)))])
        step += int(rng.integers(0, 5))
        arrivals.setdefault(step, []).append(h.request(f"m{i}", prompt, int(rng.integers(1, 12))))
    h.run(arrivals)
    res = h.facts(h.compare(f"cpu_random[{seed}]"))
    res.facts["ok_scenario"] = sum(h.external_hits.values()) > 0
    return res


def case_corrupt_cpu_chunk(model: LlamaModel, attention: Attention | None = None, **hk: Any) -> CaseResult:
    """Like ``cpu_load``, but every stored chunk is corrupted in the CPU store just before ``b``
    arrives: ``b``'s logits must differ from the recompute."""
    h = OffloadHarness(model, attention, **hk)

    def corrupt(hh: Harness) -> None:
        assert isinstance(hh, OffloadHarness)
        for chunk in range(hh.worker.store.num_chunks):
            hh.worker.store.corrupt_chunk(chunk, 3.0)

    _evict_and_reload(h, 40, 100, hooks={9: corrupt})
    res = h.facts(h.compare("corrupt_cpu_chunk", ["b"]))
    res.facts["ok_scenario"] = h.external_hits.get("b", 0) > 0
    return res


OFFLOAD_CASES: dict[str, Callable[..., CaseResult]] = {
    "cpu_load": case_cpu_load,
    "cpu_load_chunks": case_cpu_load_chunks,
    "cpu_random": case_cpu_random,
}
OFFLOAD_NEGATIVE: dict[str, Callable[..., CaseResult]] = {"corrupt_cpu_chunk": case_corrupt_cpu_chunk}
