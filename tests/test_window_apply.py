"""Playing a decode window equals playing its steps one by one, block id for block id.

The fast-forward equivalence tests compare result tables, which do not show which block a decoder
was handed: two decoders swapping their new blocks change no hit (generated blocks are hit by no
other request) but do change the free queue's order once they finish. Here one scheduler plays a
window (``plan_window`` + ``apply_window``) and its twin plays the same steps plainly; every
request's block ids, every cached count, the free queue (head first), the cache gauges and (with a
sink) the KV events must be equal after it -- with simulator-generated and with trace-given
outputs, on both pools, the window's last pops evicting cached blocks.
"""

from __future__ import annotations

import math

import pytest
from conftest import drive, make_request, make_scheduler

from sim.core.scheduler import Scheduler
from sim.replay.decode_window import plan_window
from sim.replay.window_apply import apply_window

K = 11  # window steps: every decoder crosses two or three block boundaries of 4 tokens


def _scheduler(pool_impl: str, events: bool, planned_outputs: bool) -> Scheduler:
    # 39 usable blocks: the window's last pops reach the blocks "short" frees (cached: evicted)
    sched = make_scheduler(40, block_size=4, algo="fast", events=events, pool_impl=pool_impl)
    for i, n in enumerate((9, 14, 6, 11, 16, 7)):
        kw = {"output_token_ids": [7000 + i] * 40} if planned_outputs else {}
        # uid fixed by position: both schedulers hash the same requests identically
        sched.add_request(make_request(sched, f"r{i}", range(100 * i, 100 * i + n), max_tokens=40, uid=i + 1, **kw))
    # finishes at its first step, so the free queue is no longer in block-id order
    sched.add_request(make_request(sched, "short", range(5000, 5020), max_tokens=1, uid=99))
    return sched


def _state(sched: Scheduler) -> dict:
    kvm = sched.kv_cache_manager
    pool = kvm.block_pool
    reqs = {r.request_id: r for r in sched.running}
    return {
        "blocks": {rid: [b.block_id for b in kvm.coordinator.get_blocks(rid)] for rid in reqs},
        "cached": {rid: kvm.get_num_cached_blocks(rid) for rid in reqs},
        "tokens": {rid: (r.num_computed_tokens, r.num_tokens, list(r.output_token_ids)) for rid, r in reqs.items()},
        "free": pool.free_block_ids(),
        "gauges": (pool.get_num_free_blocks(), pool.num_cached_blocks),
        "step": sched.step_index,
    }


@pytest.mark.parametrize("pool_impl", ["compiled", "python"])
@pytest.mark.parametrize(
    ("events", "planned_outputs"), [(False, False), (True, False), (False, True)],
    ids=["generated-outputs", "event-sink", "trace-outputs"],
)
def test_a_window_hands_out_the_blocks_its_steps_would(pool_impl: str, events: bool, planned_outputs: bool) -> None:
    windowed, plain = (_scheduler(pool_impl, events, planned_outputs) for _ in range(2))
    for s in (windowed, plain):
        drive(s, {}, max_steps=3, until_idle=False)  # prefill, then two decode steps
        assert all(r.num_computed_tokens == r.num_tokens - 1 for r in s.running) and len(s.running) == 6
    assert _state(windowed) == _state(plain)
    freed = windowed.kv_cache_manager.block_pool.free_block_ids()[-5:]  # "short"'s blocks, tail first

    window = plan_window(windowed, K, lambda shape, step: 0.01, 0.0, math.inf)
    assert window is not None and window.k == K and len(window.bulk) == 6 and not window.tail
    apply_window(windowed, window)
    drive(plain, {}, max_steps=K, until_idle=False)

    a, b = _state(windowed), _state(plain)
    assert a == b
    assert sum(len(v) for v in a["blocks"].values()) > 6 * 4  # blocks were handed out inside the window
    assert set(freed) & {bid for v in a["blocks"].values() for bid in v}  # and cached ones were evicted
    assert (window.free_blocks[-1], window.cached_blocks[-1]) == b["gauges"]
    windowed.check_integrity()
    if events:
        assert list(windowed.event_sink) == list(plain.event_sink)


@pytest.mark.parametrize("pool_impl", ["compiled", "python"])
def test_a_windows_gauges_are_those_of_its_steps(pool_impl: str) -> None:
    """The free count, cached count and KV usage ``apply_window`` records after each step (the
    usage one float per run of equal free counts) equal the plain steps' gauges read after each
    step, the usage float bit for bit (``pool.get_usage()``, what the plain loop records)."""
    windowed, plain = (_scheduler(pool_impl, False, False) for _ in range(2))
    for s in (windowed, plain):
        drive(s, {}, max_steps=3, until_idle=False)
    window = plan_window(windowed, K, lambda shape, step: 0.01, 0.0, math.inf)
    assert window is not None and window.k == K
    apply_window(windowed, window)
    pool = plain.kv_cache_manager.block_pool
    gauges = []
    for _ in range(K):
        drive(plain, {}, max_steps=1, until_idle=False)
        gauges.append((pool.get_num_free_blocks(), pool.num_cached_blocks, pool.get_usage().hex()))
    assert len(set(gauges)) > 2  # the gauges move inside the window
    assert list(zip(window.free_blocks, window.cached_blocks, [u.hex() for u in window.usage])) == gauges
