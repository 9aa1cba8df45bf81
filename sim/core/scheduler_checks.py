"""The scheduler's integrity check (what ``Scheduler.check_integrity`` asserts after every step in
tests), kept apart so ``sim.core.scheduler`` stays one concept under 400 lines.

Invariants asserted: the KV manager's and pool's (with an offload tier, blocks whose free is
deferred count as held); ``running`` holds distinct RUNNING requests within ``max_num_seqs``, each
with blocks for its computed tokens; a request in ``waiting`` is WAITING or PREEMPTED, has computed
nothing and holds no block; only running requests and (with a tier) ``kv_holding_waiting`` ones
hold blocks. Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.core.offload.host import SchedulerHost
from sim.core.offload.tier import OffloadTier
from sim.core.request import RequestStatus


def check_scheduler(sched: SchedulerHost, tier: OffloadTier | None) -> None:
    """Query: assert the module docstring's invariants for ``sched`` and its tier; raises
    AssertionError."""
    kvm = sched.kv_cache_manager
    if tier is None:
        kvm.check_integrity()
    else:
        tier.check_integrity()
    holders = set(kvm.request_ids())
    running_ids = {r.request_id for r in sched.running}
    assert len(running_ids) == len(sched.running), "request twice in running"
    assert len(sched.running) <= sched.config.max_num_seqs
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert r.num_computed_tokens <= r.num_tokens
        for spec, blocks in zip(kvm.kv_groups, kvm.get_blocks_by_group(r.request_id)):
            assert len(blocks) * spec.block_size >= r.num_computed_tokens, (
                f"{r.request_id}: {len(blocks)} blocks of {spec.block_size} for "
                f"{r.num_computed_tokens} computed tokens"
            )
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.num_computed_tokens == 0
        assert r.request_id not in holders, f"waiting {r.request_id} holds blocks"
    allowed = running_ids if tier is None else running_ids | {r.request_id for r in tier.kv_holding_waiting}
    assert holders <= allowed, f"blocks held by non-running requests: {holders - allowed}"
