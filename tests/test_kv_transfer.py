"""The offload tier's worker on the clock (``sim.replay.kv_transfer``) and its link
(``sim.timing.transfer_link``), as an executable spec of vLLM 0.33.0's OffloadingConnectorWorker
order: flushed and deferred stores at the step's start, then loads, then this step's stores
deferred to the next step; nothing reported before the next step's output."""

from __future__ import annotations

import pytest

from sim.core.transfer_job import KVConnectorMetadata, TransferJob
from sim.replay.kv_transfer import LinkKVWorker
from sim.timing.transfer_link import TransferLink

MB = 10**6


def meta(load_jobs: dict[int, tuple[str, int]] | None = None, store_jobs: dict[int, tuple[str, int]] | None = None,
         jobs_to_flush: set[int] | None = None) -> KVConnectorMetadata:
    """A step's metadata from ``{job_id: (request_id, num_blocks)}`` maps."""
    return KVConnectorMetadata(
        [TransferJob(j, r, "load", n) for j, (r, n) in (load_jobs or {}).items()],
        [TransferJob(j, r, "store", n, j in (jobs_to_flush or set())) for j, (r, n) in (store_jobs or {}).items()],
        set(jobs_to_flush or ()),
    )


def job(request_id: str, num_blocks: int) -> tuple[str, int]:
    return (request_id, num_blocks)


def _worker(gb_s: float = 1.0, latency_s: float = 0.0, duplex: bool = True) -> LinkKVWorker:
    return LinkKVWorker(TransferLink(gb_s, latency_s, duplex), bytes_per_block=MB)  # 1 ms per block at 1 GB/s


def test_link_is_fifo_per_direction_and_charges_bytes_over_bandwidth_plus_latency() -> None:
    link = TransferLink(2.0, latency_s=0.001)
    assert link.submit(0.0, 2 * 10**9, load=False) == pytest.approx(1.001)
    assert link.submit(0.5, 0, load=False) == pytest.approx(1.002)  # waits behind the first store
    assert link.submit(0.5, 10**9, load=True) == pytest.approx(1.001)  # its own lane: 0.5 + 1 ms + 0.5 s
    assert link.submit(0.6, 0, load=True) == pytest.approx(1.002)  # behind that load only
    assert link.submit(5.0, 10**9, load=False) == pytest.approx(5.501)
    assert link.bytes_moved == 4 * 10**9
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        TransferLink(0.0)


# Two 10 MB stores then a 1 MB load, all submitted at t=0 on a 1 GB/s link with 1 ms per transfer.
# Duplex (vLLM's store and load handlers, a full-duplex PCIe / NVLink-C2C link): the load takes
# 1 ms + 1 ms on its own lane. Shared: stores land at 11 ms and 22 ms, the load 2 ms after: 24 ms.
@pytest.mark.parametrize(("duplex", "stores_done", "load_done"), [
    (True, (0.011, 0.022), 0.002),
    (False, (0.011, 0.022), 0.024),
])
def test_a_load_behind_two_stores_golden(duplex: bool, stores_done: tuple[float, float], load_done: float) -> None:
    link = TransferLink(1.0, latency_s=0.001, duplex=duplex)
    done = (link.submit(0.0, 10 * MB, load=False), link.submit(0.0, 10 * MB, load=False))
    assert done == pytest.approx(stores_done)
    assert link.submit(0.0, MB, load=True) == pytest.approx(load_done)
    # a store after the load: duplex, behind the stores only; shared, behind the load too
    assert link.submit(0.0, 0, load=False) == pytest.approx(0.023 if duplex else 0.025)


def test_fast_link_reports_every_job_exactly_one_step_later() -> None:
    w = _worker(gb_s=1e9)
    assert w.start_step(0, 0.0, meta(load_jobs={1: job("a", 4)}, store_jobs={2: job("b", 2)})) == 0.0
    assert w.finish_step(0, 0.01).completed_jobs == set()  # never in the carrying step's own output
    w.start_step(1, 0.01, None)  # the deferred store goes on the link now
    rep = w.finish_step(1, 0.02)
    assert rep.completed_jobs == {1, 2} and rep.finished_recving == {"a"}
    assert not w.has_pending()


def test_stores_are_submitted_at_the_next_steps_start_behind_nothing_of_their_own_step() -> None:
    w = _worker()
    w.start_step(0, 0.0, meta(store_jobs={7: job("a", 10)}))  # 10 ms of store, deferred
    assert w.in_flight == {} and w.has_pending()
    w.start_step(1, 1.0, meta())
    assert w.in_flight[7].done_at == pytest.approx(1.010)
    assert w.finish_step(1, 1.005).completed_jobs == set()  # still on the link at the step's end
    assert w.finish_step(2, 1.020).completed_jobs == {7}


def test_a_load_waits_behind_stores_only_on_a_shared_link() -> None:
    for duplex, load_done in ((False, 0.101), (True, 0.001)):
        w = _worker(duplex=duplex)
        w.start_step(0, 0.0, meta(store_jobs={1: job("a", 100)}))
        w.start_step(1, 0.0, meta(load_jobs={2: job("b", 1)}))  # the store (100 ms) is submitted first
        assert w.in_flight[2].done_at == pytest.approx(load_done)
        assert w.finish_step(1, 0.05).completed_jobs == set()  # a load: not in its own step's output
        rep = w.finish_step(2, 0.2)
        assert rep.completed_jobs == {1, 2} and rep.finished_recving == {"b"}


def test_flushed_jobs_delay_the_forward_and_complete_in_their_own_step() -> None:
    w = _worker()
    step_meta = meta(store_jobs={3: job("p", 20), 4: job("q", 5)}, jobs_to_flush={3})
    wait = w.start_step(0, 0.0, step_meta)
    assert wait == pytest.approx(0.020)  # the preempted request's store, waited for before the forward
    assert w.flush_wait_s == pytest.approx(0.020)
    rep = w.finish_step(0, wait + 0.01)
    assert rep.completed_jobs == {3}  # job 4 is deferred to the next step's start
    w.start_step(1, 0.03, None)
    assert w.finish_step(1, 0.04).completed_jobs == {4}


def test_an_empty_step_polls_until_the_first_job_it_may_report() -> None:
    w = _worker()
    w.start_step(0, 0.0, meta(load_jobs={1: job("a", 50)}))
    assert w.idle_until(0, 0.0) == 0.0  # a load is never reported in its own step: no wait
    w.start_step(1, 0.0, None)
    end = w.idle_until(1, 0.0)
    assert end == pytest.approx(0.050)
    assert w.finish_step(1, end).finished_recving == {"a"}
    assert w.idle_until(2, end) == end and not w.has_pending()
    assert (w.num_loads, w.load_bytes, w.num_stores, w.store_bytes) == (1, 50 * MB, 0, 0)
