"""The CPU offload tier on the real backend (issue 33 item 4): the worker copies blocks between the
paged cache and a CPU store as the scheduler's connector metadata says, and a prefix loaded back
from the CPU tier gives the same logits as a dense recompute (fp32, 1e-5), on CPU torch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("torch_one_thread")  # the `model` fixture is in conftest.py

from gpu_backend.executor.cpu_kv_store import CopyQueue, CPUKVStore, device_tensors, host_runs  # noqa: E402
from gpu_backend.executor.offload_worker import CopySpec, TorchOffloadWorker  # noqa: E402
from gpu_backend.layout.kv_cache import PagedKVCache  # noqa: E402
from gpu_backend.validation import cases  # noqa: E402
from gpu_backend.validation.cases_offload import (  # noqa: E402
    case_corrupt_cpu_chunk,
    case_cpu_load,
    case_cpu_load_chunks,
    case_cpu_random,
)
from sim.core.transfer_job import KVConnectorMetadata, TransferJob  # noqa: E402


def _check(r: cases.CaseResult) -> None:
    assert r.facts["ok_scenario"], f"scenario did not happen: {r.facts}"
    assert r.num_compared > 0
    assert r.max_abs_diff <= cases.FP32_TOL, r.summary()


def test_host_runs_coalesce_consecutive_host_rows_whatever_the_device_blocks():
    assert host_runs([4, 5, 6, 9], [1, 2, 3, 7]) == [(4, [1, 2, 3]), (9, [7])]
    assert host_runs([0, 1, 2], [5, 3, 8]) == [(0, [5, 3, 8])]  # one run: gathered / scattered on the device
    with pytest.raises(ValueError, match="as many host rows as device blocks"):
        host_runs([1], [])


def test_store_layout_chunk_holds_its_sub_blocks_and_a_round_trip_is_exact():
    cache = PagedKVCache(2, 6, 4, 2, 8)
    for t in device_tensors(cache):
        t.copy_(torch.randn_like(t))
    store = CPUKVStore(cache, num_chunks=3, blocks_per_chunk=2)
    assert store.k[0].shape == (6, 4, 2, 8) and not store.pinned  # 3 chunks x 2 blocks, no CUDA
    assert store.sub_blocks([2, 0]) == [4, 5, 0, 1]
    assert store.sub_blocks([2, 0], skip=1, count=2) == [5, 0]  # a load whose GPU hit ends in chunk 2
    down = CopyQueue(device_tensors(cache), store.tensors, "dst")
    up = CopyQueue(store.tensors, device_tensors(cache), "src")
    assert down.bytes_per_block == 2 * 2 * 4 * 2 * 8 * 4  # K and V of 2 layers, fp32
    down.submit(7, [3, 1], store.sub_blocks([2]))  # GPU blocks 3, 1 -> chunk 2
    (tr,) = down.done()
    assert tr.job_id == 7 and tr.num_bytes == 2 * down.bytes_per_block and tr.elapsed_s() >= 0
    assert torch.equal(store.v[1][4], cache.v[1][3]) and torch.equal(store.k[0][5], cache.k[0][1])
    want = [t[[3, 1]].clone() for t in device_tensors(cache)]
    up.submit(8, store.sub_blocks([2]), [4, 5])
    assert [x.job_id for x in up.done()] == [8] and up.done() == []  # reported once
    for t, w in zip(device_tensors(cache), want):
        assert torch.equal(t[4:6], w)
    up.submit(9, store.sub_blocks([2]), [5, 1])  # scattered device blocks: one copy, then index_copy_
    assert [x.job_id for x in up.done()] == [9]
    for t, w in zip(device_tensors(cache), want):
        assert torch.equal(t[5], w[0]) and torch.equal(t[1], w[1])


class _Table:
    """Addresses from a table (job id -> CopySpec), instead of a scheduler's connector."""

    def __init__(self, specs: dict[int, CopySpec]) -> None:
        self.specs = specs

    def of(self, job: TransferJob) -> CopySpec:
        return self.specs[job.job_id]


def _meta(loads=(), stores=(), flush=()) -> KVConnectorMetadata:
    return KVConnectorMetadata([TransferJob(j, r, "load", n) for j, r, n in loads],
                               [TransferJob(j, r, "store", n, j in flush) for j, r, n in stores], set(flush))


def test_worker_follows_vllms_step_order_on_a_cpu_device():
    """vLLM's OffloadingConnectorWorker order, copies done at once on a CPU: a store of step s goes
    on the link at step s+1's start and is reported in its output; a load of step s is reported in
    step s+1's; a store flushed in step s is submitted, waited for and reported in step s."""
    cache = PagedKVCache(1, 8, 4, 1, 4)
    for t in device_tensors(cache):
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).view_as(t))
    store = CPUKVStore(cache, num_chunks=4)
    w = TorchOffloadWorker(cache, store, _Table({1: CopySpec((2, 3), (0, 1)), 2: CopySpec((6,), (0,)),
                                                 3: CopySpec((5,), (2,)), 4: CopySpec((7,), (3,))}))
    w.start_step(0, _meta(stores=[(1, "a", 2)]))
    assert w.counters.num_stores == 0 and w.has_pending()  # deferred to the next step's start
    assert w.finish_step(0).is_empty()
    w.start_step(1, _meta(loads=[(2, "b", 1)]))
    assert torch.equal(store.k[0][:2], cache.k[0][2:4]) and torch.equal(cache.v[0][6], store.v[0][0])
    assert w.awaiting_admission == {"b"}
    rep = w.finish_step(1)
    assert rep.completed_jobs == {1} and rep.finished_recving == set()  # the load waits for step 2
    w.start_step(2, _meta(stores=[(3, "c", 1), (4, "d", 1)], flush={3}))
    assert w.counters.flushes == 1 and w.counters.num_stores == 2  # 3 flushed now, 4 deferred
    rep = w.finish_step(2)
    assert rep.completed_jobs == {2, 3} and rep.finished_recving == {"b"}
    w.start_step(3, None)
    assert w.finish_step(3).completed_jobs == {4} and not w.has_pending()
    assert [k for k, _, _ in w.counters.transfers] == ["store", "load", "store", "store"]


def test_prefix_loaded_from_cpu_equals_recompute(model):
    r = case_cpu_load(model)
    _check(r)
    assert r.facts["hits"]["b"] == 16 and r.facts["external_hits"]["b"] == 16  # 1 GPU block + 1 loaded
    assert r.facts["loads"] == 1


def test_load_inside_a_chunk_skips_the_gpu_held_sub_block(model):
    r = case_cpu_load_chunks(model)
    _check(r)
    assert r.facts["hits"]["b"] == 16 and r.facts["external_hits"]["b"] == 48  # chunks of 32, hit ends in one
    assert r.facts["loads_with_skip"] == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_random_workload_with_both_tiers_evicting(model, seed):
    r = case_cpu_random(model, seed=seed)
    _check(r)
    assert r.facts["loads"] >= 4 and r.facts["cpu_evictions"] > 0 and r.facts["evictions"] > 0


def test_random_workload_with_a_flush(model):
    r = case_cpu_random(model, seed=0)
    _check(r)
    assert r.facts["flushes"] >= 1 and r.facts["preemptions"] >= 1


def test_negative_control_corrupted_cpu_chunk_fails_the_comparison(model):
    r = case_corrupt_cpu_chunk(model)
    assert r.facts["ok_scenario"], r.facts
    assert not r.passes(torch.float32)
    assert r.max_abs_diff > 1e3 * cases.FP32_TOL, r.summary()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 3), max_size=2), st.lists(st.integers(1, 3), max_size=3),
                          st.integers(0, 3)), min_size=1, max_size=8))
def test_property_every_job_is_reported_once_never_in_its_own_step_unless_flushed(plan):
    """Random steps of loads and stores (``(load sizes, store sizes, flush mask)``): every job is
    reported exactly once; a job is never reported in the output of the step whose metadata carried
    it unless that step flushed it, and a flushed store is reported in its own step; nothing is left
    pending after two empty steps (on a CPU device every copy is done when submitted)."""
    cache = PagedKVCache(1, 8, 2, 1, 2)
    for t in device_tensors(cache):
        t.copy_(torch.randn_like(t))
    store = CPUKVStore(cache, num_chunks=6)
    specs: dict[int, CopySpec] = {}
    w = TorchOffloadWorker(cache, store, _Table(specs))
    carried: dict[int, int] = {}
    flushed: set[int] = set()
    reported: dict[int, int] = {}
    job = 0
    for step, (loads, stores, mask) in enumerate([*plan, ([], [], 0), ([], [], 0)]):
        ld, sd = [], []
        for n in loads:
            specs[job] = CopySpec(tuple(range(1, n + 1)), tuple(range(n)))
            ld.append((job, f"r{job}", n))
            job += 1
        for i, n in enumerate(stores):
            specs[job] = CopySpec(tuple(range(8 - n, 8)), tuple(range(6 - n, 6)))
            sd.append((job, f"r{job}", n))
            if mask >> i & 1:
                flushed.add(job)
            job += 1
        for j, _, _ in (*ld, *sd):
            carried[j] = step
        w.start_step(step, _meta(loads=ld, stores=sd, flush={j for j, _, _ in sd if j in flushed}))
        for j in w.finish_step(step).completed_jobs:
            assert j not in reported
            reported[j] = step
    assert set(reported) == set(carried) and not w.has_pending()
    for j, s in reported.items():
        assert s == carried[j] if j in flushed else s > carried[j]
