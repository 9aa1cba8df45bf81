"""The compiled LRU tier (``sim.core.offload.chunk_table.LRUChunkTable``) against its oracles: the
Python ``CPUOffloadingManager`` over the rank-group LRU and over vLLM's heap LRU as written
(``lru_reference``). The same random calls -- offers (prepare_store), store completions, loads
(prepare_load / complete_load), finishes and lookups, on requests sharing prefixes, in a tier small
enough to evict and refuse -- must give the same answers (stored keys, victims in order, chunk ids,
None), the same lookups, counters and usage, the same eviction order, and vLLM's exact ranks."""

from __future__ import annotations

import hashlib
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.offload.manager import CPUOffloadingManager, LookupResult, PrepareStoreOutput
from sim.core.offload.manager_impl import OffloadingManager, compiled_table_class, make_offloading_manager
from sim.core.offload.policy import ReqContext

TPC = 16
needs_table = pytest.mark.skipif(compiled_table_class() is None, reason="the compiled tier is not built")

# a request: (family, branch point, branch, length); keys[i] names its whole prefix, so requests of
# one family share their keys before the branch point and a key sits at one index in every request
REQ = st.tuples(st.integers(0, 1), st.integers(0, 6), st.integers(0, 2), st.integers(1, 9))
OP = st.tuples(st.sampled_from(["offer", "offer", "offer", "done", "done", "load", "unload", "finish", "look"]),
               st.integers(0, 5), st.integers(0, 9), st.integers(0, 9))


def _keys(family: int, branch_at: int, branch: int, n: int, kind: str = "short") -> list[bytes]:
    """A request's keys: short ``bytes``, 16-byte ones (as the engine's block hashes, whose table hash
    is mixed from their two words) or both (by index), each call making new objects."""
    names = [f"{family}:{i}" if i < branch_at else f"{family}:{branch}@{branch_at}:{i}" for i in range(n)]
    return [hashlib.md5(name.encode()).digest() if kind == "bytes16" or (kind == "mixed" and i % 2)
            else name.encode() for i, name in enumerate(names)]


def _out(res: PrepareStoreOutput | None, compiled: bool) -> tuple[list[bytes], list[bytes], list[int]] | None:
    if res is None:
        return None
    ids = list(res.chunks) if compiled else [c.chunk_id for c in res.chunks]
    return list(res.keys_to_store), list(res.evicted_keys), ids


class Twins:
    """The compiled table and its two Python oracles, driven together."""

    def __init__(self, capacity: int, requests: list[tuple[int, int, int, int]], kind: str = "short") -> None:
        self.table = make_offloading_manager(capacity, "lru", 0, TPC)
        self.oracles = [CPUOffloadingManager(capacity, "lru"), CPUOffloadingManager(capacity, "lru_reference")]
        self.keys = [_keys(*r, kind) for r in requests]
        self.ctxs: list[list[ReqContext]] = []
        for i, keys in enumerate(self.keys):
            ctxs = [ReqContext(f"r{i}") for _ in range(3)]
            for ctx in ctxs[1:]:
                ctx.key_positions = {k: (j + 1) * TPC for j, k in enumerate(keys)}
            self.ctxs.append(ctxs)
        self.finished: set[int] = set()
        self.stores: list[tuple[list[bytes], list[list[Any]]]] = []  # (keys, chunks per manager)
        self.loads: list[list[bytes]] = []

    def managers(self) -> list[OffloadingManager]:
        return [self.table, *self.oracles]

    def offer(self, r: int, a: int, b: int) -> None:
        keys = self.keys[r]
        start, stop = min(a, b), min(max(a, b), len(keys))
        outs = [m.prepare_store(keys[start:stop], ctx, start)
                for m, ctx in zip(self.managers(), self.ctxs[r], strict=True)]
        got = [_out(o, i == 0) for i, o in enumerate(outs)]
        assert got[0] == got[1] == got[2], got
        if outs[0] is not None and outs[0].keys_to_store:
            self.stores.append((list(outs[0].keys_to_store), [o.chunks for o in outs if o is not None]))

    def done(self, j: int) -> None:
        if self.stores:
            keys, chunks = self.stores.pop(j % len(self.stores))
            for m, c in zip(self.managers(), chunks, strict=True):
                m.complete_store(keys, c)

    def load(self, r: int, a: int, b: int) -> None:
        keys = self.keys[r]
        start, stop = min(a, b), min(max(a, b), len(keys))
        span = keys[start:stop]
        if not span or any(self.oracles[0].lookup(k) is not LookupResult.HIT for k in span):
            return
        for m, ctx in zip(self.managers(), self.ctxs[r], strict=True):
            m.prepare_load(span, ctx, start)
        self.loads.append(span)

    def unload(self, j: int) -> None:
        if self.loads:
            span = self.loads.pop(j % len(self.loads))
            for m in self.managers():
                m.complete_load(span)

    def finish(self, r: int) -> None:
        self.finished.add(r)
        for m, ctx in zip(self.managers(), self.ctxs[r], strict=True):
            m.on_request_finished(ctx)

    def look(self, r: int, a: int, b: int) -> None:
        keys = self.keys[r]
        for flag in (False, True):
            runs = [m.lookup_run(keys, a, b, flag) for m in self.managers()]
            assert runs[0] == runs[1] == runs[2], runs
        for k in keys:
            assert self.table.lookup(k) is self.oracles[0].lookup(k) is self.oracles[1].lookup(k)
        firsts = [m.first_pending(keys[a:]) for m in self.managers()]
        assert firsts[0] == firsts[1] == firsts[2], firsts

    def compare(self) -> None:
        t, g, h = (cast(Any, m) for m in self.managers())  # (each one's own queries)
        for m in self.managers():
            m.check_integrity()
        assert t.stats == g.stats == h.stats
        assert t.num_resident() == g.num_resident() == h.num_resident()
        assert t.usage() == g.usage() == h.usage()
        assert t.num_write_pending == g.num_write_pending == h.num_write_pending
        order = t.policy.eviction_order()
        assert order == g.policy.eviction_order() == h.policy.eviction_order()
        assert t.policy.ranks == h.policy.ranks
        for k in t.policy.keys():
            mine, theirs = t.policy.get(k), g.policy.get(k)
            assert theirs is not None and (mine.chunk_id, mine.ref_cnt) == (theirs.chunk_id, theirs.ref_cnt)


@needs_table
@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 8), requests=st.lists(REQ, min_size=1, max_size=6),
       ops=st.lists(OP, min_size=1, max_size=60), kind=st.sampled_from(["short", "bytes16", "mixed"]))
def test_compiled_table_equals_python_managers(
    capacity: int, requests: list[tuple[int, int, int, int]], ops: list[tuple[str, int, int, int]], kind: str
) -> None:
    twins = Twins(capacity, requests, kind)
    for kind, r, a, b in ops:
        r %= len(requests)
        if kind in ("offer", "load", "finish") and r in twins.finished:
            continue
        if kind == "offer":
            twins.offer(r, a, b)
        elif kind == "done":
            twins.done(a)
        elif kind == "load":
            twins.load(r, a, b)
        elif kind == "unload":
            twins.unload(a)
        elif kind == "finish":
            twins.finish(r)
        else:
            twins.look(r, a, b)
        twins.compare()


@needs_table
def test_a_position_past_32_bits_is_refused() -> None:
    """The table keeps a chunk's minor rank (minus its end position) in 32 bits: an offer reaching
    past token 2**31 - 1 is refused with OverflowError, never wrapped into a wrong rank."""
    table = make_offloading_manager(4, "lru", 0, 2**30)
    assert table.prepare_store([b"a"], ReqContext("r0"), 0) is not None  # (ends at token 2**30)
    with pytest.raises(OverflowError, match="2\\*\\*31 - 1 tokens"):
        table.prepare_store([b"b", b"c"], ReqContext("r1"), 1)
    assert table.num_resident() == 1 and table.lookup(b"b") is LookupResult.MISS  # (nothing changed)


@needs_table
@pytest.mark.parametrize("events", [False, True])
def test_evictions_not_reported_leave_the_victims_out_and_nothing_else(events: bool) -> None:
    """``report_evictions=False`` (the connector's table) empties ``evicted_keys`` and changes no
    other answer, unless the KV events are on: then the victims are listed, for them."""
    tables = [cast(Any, make_offloading_manager(3, "lru", 0, TPC, report_evictions=r)) for r in (True, False)]
    for t in tables:
        t.events = [] if events else None
    for i in range(6):
        keys = _keys(i % 2, 0, i, 2 + i % 3, "mixed")
        ctxs = [ReqContext(f"r{i}") for _ in tables]
        outs = [t.prepare_store(keys, ctx, 0) for t, ctx in zip(tables, ctxs, strict=True)]
        for t, ctx, out in zip(tables, ctxs, outs, strict=True):
            if out is not None:
                t.complete_store(out.keys_to_store, out.chunks)
            t.on_request_finished(ctx)
        full, quiet = (_out(o, True) for o in outs)
        if full is None or quiet is None:
            assert full is quiet is None
            continue
        assert quiet == (full if events else (full[0], [], full[2]))
    assert tables[0].stats == tables[1].stats and tables[0].policy.ranks == tables[1].policy.ranks
    assert tables[0].events == tables[1].events


@needs_table
def test_compiled_table_needs_the_first_index() -> None:
    """An offer or load without the index of its first key is refused by the compiled table (it
    reads a key's position from it)."""
    table = make_offloading_manager(4, "lru", 0, TPC)
    with pytest.raises(ValueError, match="index of the first key"):
        table.prepare_store([b"k"], ReqContext("r"))


def test_the_python_manager_is_chosen_where_the_table_does_not_apply() -> None:
    """ARC, a store threshold of 2 or more, and ``impl="python"`` get the Python manager."""
    assert isinstance(make_offloading_manager(4, "arc", 0, TPC), CPUOffloadingManager)
    assert isinstance(make_offloading_manager(4, "lru", 2, TPC), CPUOffloadingManager)
    assert isinstance(make_offloading_manager(4, "lru", 0, TPC, "python"), CPUOffloadingManager)
    built = compiled_table_class() is not None  # (without the build: the Python manager for all)
    assert isinstance(make_offloading_manager(4, "lru", 1, TPC), CPUOffloadingManager) is not built
    with pytest.raises(ValueError, match="unknown CPU-tier manager"):
        make_offloading_manager(4, "lru", 0, TPC, "fast")


@needs_table
@pytest.mark.parametrize("engine", [
    {"num_cpu_blocks": 1200}, {"max_num_batched_tokens": 256, "kv_offloading_block_size": 32, "num_cpu_blocks": 800},
])
def test_a_replay_on_the_compiled_table_equals_one_on_the_python_manager(engine: dict[str, Any]) -> None:
    """A tiered replay (fast-forward on) gives the same tables and tier counters on either manager."""
    import pandas as pd
    from test_tier_window import _cfg

    from sim.core.offload.connector import OffloadingConnectorScheduler
    from sim.experiment.engine_description import resolve
    from sim.experiment.kv_worker import build_kv_worker
    from sim.experiment.run import build_scheduler, simulated_executor
    from sim.experiment.workload import build_workload
    from sim.replay.engine import Replay, ReplayResult

    def run(impl: str) -> ReplayResult:
        cfg = _cfg(True, **engine)
        desc = resolve(cfg)
        sched = build_scheduler(desc)
        tier = sched.tier
        assert tier is not None and type(tier.connector.manager).__name__ == "LRUChunkTable"
        if impl == "python":  # (before any request: the connector holds no state yet)
            offload = sched.cache_config.offload
            assert offload is not None
            tier.connector = OffloadingConnectorScheduler(offload, sched.cache_config.block_size, manager_impl="python")
        replay = Replay(sched, simulated_executor(cfg, sched), build_workload(cfg, desc).requests,
                        kv_worker=build_kv_worker(desc))
        return replay.run()

    fast, ref = run("compiled"), run("python")
    pd.testing.assert_frame_equal(fast.requests, ref.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, ref.steps, check_exact=True)
    for key in ("prompt_tokens_by_source", "external_prefix_cache", "cpu_tier", "prefix_cache_hit_rate"):
        assert fast.summary[key] == ref.summary[key], key
    assert fast.summary["cpu_tier"]["chunks_evicted"] > 0 and fast.summary["cpu_tier"]["chunks_loaded"] > 0
