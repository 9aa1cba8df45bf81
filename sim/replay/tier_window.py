"""Decode windows with a CPU offload tier: when the connector's work over k steps is known in
advance, and how a window plays it (``sim.replay.decode_window`` plays the steps themselves).

vLLM 0.33.0's connector works at the end of every ``schedule()`` (``build_connector_meta`` in
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``): it refreshes each scheduled
request's keys and block ids, offers the chunks that became storable, flushes stores whose source
blocks are handed out again, and runs the final store pass and policy commit of the requests
finished since the previous step; each step's output then completes the transfers the worker
reports. A window of pure decodes plans none of that when the connector is *quiet* at its start
(:func:`tier_quiet`):

* nothing is batched for the next ``build_connector_meta`` (no finished request awaits its commit,
  no load or flush is planned), no request waits for a load (``kv_holding_waiting``) and no load is
  in flight;
* only prompt tokens are offloaded (``offload_prompt_only``, vLLM's default), and every running
  request has offered every chunk of its prompt: a decode step's store pass is then a no-op;
* no finished request's store is in flight (``block_id_to_pending_jobs``), so no block a decoder
  allocates in the window needs a flush;
* the window has no tail (no prefill chunk: those would offer new chunks);
* stores of running requests may be in flight: the worker reports them step by step inside the
  window (:func:`play_window_transfers`); but then no step of the window may look the waiting head
  up (a lookup that met a chunk still being stored would defer the head, and the waiting loop would
  go on to the next request).

With no store in flight the head's refused lookups are side-effect free (they find no pending
chunk and only reset the store progress of a request that never ran). Requests finish only at a
window's last step, so their final pass and commit run in the next plain step, as in the plain
loop. After a window the connector's step count moves on by k and every bulk request's keys and
block ids are brought up to date (its block ids are its block table: vLLM's are the admitted table
extended by each step's new blocks).

Invariant: a window's tables, stats, KV events and tier counters equal the plain loop's
(``tests/test_tier_window.py``). Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.core.offload.tier import OffloadTier
from sim.core.scheduler import Scheduler
from sim.core.transfer_job import KVConnectorOutput
from sim.replay.decode_window import Window
from sim.replay.kv_transfer import LinkKVWorker


def tier_quiet(sched: Scheduler, tier: OffloadTier) -> bool:
    """Query: a decode window may start now (see the module docstring; the window itself is checked
    by :func:`window_allowed`)."""
    conn = tier.connector
    if (not conn.offload_prompt_only or tier.kv_holding_waiting or tier.finished_recving or conn.has_step_work()
            or conn.block_id_to_pending_jobs or conn.chunks_being_loaded):
        return False
    tpc, bpc = conn.tokens_per_chunk, conn.blocks_per_chunk
    for r in sched.running:
        st = conn.req_status.get(r.request_id)
        if st is None or r.num_computed_tokens < r.num_prompt_tokens:
            return False
        if st.next_stored_chunk_idx < st.storable_chunks(r.num_prompt_tokens, tpc, bpc):
            return False  # an offer still to make (e.g. after an allocation failure)
    return True


def window_allowed(tier: OffloadTier, window: Window) -> bool:
    """Query: a window planned while the connector was quiet has no prefill tail, and no lookup of
    the waiting head while a store is in flight."""
    return not window.tail and not (tier.connector.jobs and any(window.lookups))


def play_window_transfers(
    sched: Scheduler, tier: OffloadTier, worker: LinkKVWorker, window: Window, apply_steps: Callable[[], None]
) -> None:
    """Changes state: the window's steps (``apply_steps()``, ``sim.replay.window_apply``) with the
    worker's reports of each step: those of the steps before the last complete before the window's
    block operations (nothing in them reads the connector), the last step's after them, as
    ``update_from_output`` completes them after freeing the finished requests."""
    reports: list[KVConnectorOutput] = []
    if worker.has_pending():
        first = sched.step_index
        starts = window.starts
        for j in range(window.k):
            worker.start_step(first + j, starts[j], None)
            reports.append(worker.finish_step(first + j, starts[j + 1]))
    for rep in reports[:-1]:
        tier.update_from_kv_xfer_finished(rep)
    apply_steps()
    if reports:
        tier.update_from_kv_xfer_finished(reports[-1])
    after_tier_window(sched, tier, window)


def after_tier_window(sched: Scheduler, tier: OffloadTier, window: Window) -> None:
    """Changes state: the connector after a played window (see the module docstring)."""
    conn = tier.connector
    conn.step += window.k
    kvm = sched.kv_cache_manager
    hpc, tpc = conn.hashes_per_chunk, conn.tokens_per_chunk
    held = kvm.request_ids()
    for r in window.bulk:
        st = conn.req_status.get(r.request_id)
        if st is None:
            continue
        st.update_offload_keys(hpc, tpc)
        if r.request_id in held:  # (a request that finished at the last step holds none)
            # its table only grew in the window: append the new tail (a copy of the whole table per
            # window cost 1.5 s of a 2,000-request Mooncake bench)
            blocks = kvm.get_blocks(r.request_id)
            n = len(st.block_ids)
            if len(blocks) > n:
                st.block_ids.extend([b.block_id for b in blocks[n:]])
