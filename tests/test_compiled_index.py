"""The compiled KV-event index (``sim.cluster.compiled_index``) answers as the Python one, its
oracle: the same random calls to both give the same matches (keys, values and order) and entry
counts after every call, through growth, backward-shift deletions (probe runs that wrap around
the table's end included) and rebuilds."""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.prefix_index import KVEventIndex, ShardedKVEventIndex, make_kv_event_index

compiled_index = pytest.importorskip("sim.cluster.compiled_index", reason="the Cython extension is not built")
CompiledKVEventIndex = compiled_index.CompiledKVEventIndex

# a small universe makes hashes collide across replicas and calls; a few 64-bit ones test the width
WIDE = [2**64 - 1, 2**63, 2**63 - 1, 0x9E3779B97F4A7C15]
HASHES = st.one_of(st.integers(0, 40), st.sampled_from(WIDE))
UNIVERSE = [*range(41), *WIDE]
N = 20


def _holders(idx: object, h: int) -> dict[int, int]:
    """Which replicas hold ``h`` (a one-hash match over all of them): the index's whole state, hash
    by hash."""
    return idx.match([h], range(N))  # type: ignore[attr-defined]


@st.composite
def calls(draw: st.DrawFn) -> list[tuple]:
    out = []
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["store", "store", "remove", "clear", "match"]))
        if kind == "clear":
            out.append((kind, draw(st.integers(0, N - 1))))
        elif kind == "match":
            out.append((kind, draw(st.lists(HASHES, max_size=12)),
                        draw(st.lists(st.integers(0, N - 1), max_size=N))))
        else:
            out.append((kind, draw(st.integers(0, N - 1)), draw(st.lists(HASHES, max_size=30))))
    return out


def _call_both(py: Any, c: Any, call: tuple) -> None:
    """One drawn call on the Python index and the compiled one: a match must answer the same, in the
    same order; any other call changes both."""
    if call[0] == "match":  # (the hashes as a list, an array('Q') read in place, any other iterable)
        want = py.match(call[1], call[2])
        for hashes in (call[1], array("Q", call[1]), tuple(call[1])):
            got = c.match(hashes, call[2])
            assert got == want and list(got.items()) == list(want.items())
    else:
        getattr(py, call[0])(*call[1:])
        getattr(c, call[0])(*call[1:])


@settings(max_examples=300, deadline=None)
@given(calls())
def test_the_compiled_index_answers_as_the_python_one(seq: list[tuple]) -> None:
    py, c = KVEventIndex(N), CompiledKVEventIndex(N, initial_slots=8)  # small: probes collide at once
    for call in seq:
        _call_both(py, c, call)
        assert [c.num_entries(r) for r in range(N)] == [py.num_entries(r) for r in range(N)]
        assert [_holders(c, h) for h in UNIVERSE] == [_holders(py, h) for h in UNIVERSE]


def _home(h: int, cap: int) -> int:
    """The compiled table's home slot of ``h`` (SplitMix64's finaliser, as ``_mix``)."""
    m = 2**64 - 1
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & m
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & m
    return (h ^ (h >> 31)) & (cap - 1)


# hashes whose home is one of the last two slots or the first two of a 16-slot table: their probe
# runs wrap around its end, where a deletion's shift crosses from the last slot to slot 0
WRAP = [h for home, k in ((14, 2), (15, 3), (0, 2), (1, 1))
        for h in [h for h in range(5_000) if _home(h, 16) == home][:k]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "remove"]), st.integers(0, 1),
                          st.lists(st.sampled_from(WRAP), max_size=4)), max_size=40))
def test_deletions_in_probe_runs_that_wrap_around_answer_as_the_oracle(seq: list[tuple]) -> None:
    py, c = KVEventIndex(2), CompiledKVEventIndex(2, initial_slots=16)  # (at most 7 live: no rebuild)
    for kind, replica, hashes in seq:
        getattr(py, kind)(replica, hashes)
        getattr(c, kind)(replica, hashes)
        assert [c.match([h], [0, 1]) for h in WRAP] == [py.match([h], [0, 1]) for h in WRAP]
        assert [c.num_entries(r) for r in (0, 1)] == [py.num_entries(r) for r in (0, 1)]


def test_it_grows_rebuilds_and_deletes_like_the_oracle() -> None:
    py, c = KVEventIndex(3), CompiledKVEventIndex(3)
    for idx in (py, c):  # 10,000 hashes stored, half removed, stored again: tables rebuilt many times
        idx.store(0, range(10_000))
        idx.store(1, range(5_000, 15_000))
        idx.remove(0, range(0, 10_000, 2))
        idx.clear(1)
        idx.store(2, range(0, 20_000, 3))
    probe = list(range(0, 30))
    assert c.match(probe, [0, 1, 2]) == py.match(probe, [0, 1, 2])
    assert [c.num_entries(r) for r in range(3)] == [py.num_entries(r) for r in range(3)] == [5_000, 0, 6_667]


def test_tables_past_2_mib_in_their_own_mapping_answer_as_the_oracle() -> None:
    """Past 2 MiB a table has its own huge-page mapping (``mask_table.pxi``): grown into it, shrunk
    out of it by a clear's rebuild, grown again -- the answers stay the oracle's."""
    py, c = KVEventIndex(3), CompiledKVEventIndex(3)
    big = CompiledKVEventIndex(3, initial_slots=1 << 18)  # (starts at 4 MiB)
    for idx in (py, c, big):
        idx.store(0, range(0, 600_000, 2))   # 300,000 live: 2**21 slots, 32 MiB
        idx.store(1, range(1, 200_000, 3))
        idx.remove(0, range(0, 300_000, 4))
        idx.clear(0)                         # rebuilt for 66,667 live: 4 MiB
        idx.store(2, range(5, 400_000, 7))
    probe = [*range(0, 60), *range(299_990, 300_010), 2**64 - 1]
    assert c.match(probe, [0, 1, 2]) == big.match(probe, [0, 1, 2]) == py.match(probe, [0, 1, 2])
    assert [c.num_entries(r) for r in range(3)] == [big.num_entries(r) for r in range(3)] \
        == [py.num_entries(r) for r in range(3)] == [0, 66_667, 57_143]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 1, 1, 2]), st.lists(HASHES, max_size=40)),
                max_size=30))
def test_a_long_raw_batch_applies_as_its_calls(events: list[tuple]) -> None:
    """``apply_raw`` (the hashes gathered apart from the headers, then through the lookahead ring)
    leaves the index as the store/remove/clear calls of its events do; a cleared event's words, if
    any, are skipped."""

    py, c = KVEventIndex(4), CompiledKVEventIndex(4, initial_slots=8)
    for replica in range(4):
        words = array("Q")
        for r, kind, hashes in events:
            if r != replica:
                continue
            words.append(kind | len(hashes) << 8)
            words.extend(hashes)
            if kind == 0:
                py.store(replica, hashes)
            elif kind == 1:
                py.remove(replica, hashes)
            else:
                py.clear(replica)
        c.apply_raw(replica, words)
    assert [c.num_entries(r) for r in range(4)] == [py.num_entries(r) for r in range(4)]
    assert [c.match([h], range(4)) for h in UNIVERSE] == [py.match([h], range(4)) for h in UNIVERSE]


def test_replica_numbers_are_checked_and_large_fleets_get_the_python_index() -> None:
    c = CompiledKVEventIndex(4)
    with pytest.raises(IndexError, match="replica 4"):
        c.store(4, [1])
    with pytest.raises(ValueError, match="0 to 64 replicas"):
        CompiledKVEventIndex(65)
    with pytest.raises(TypeError, match="array\\('Q'\\)"):  # (an array of another type: not words)
        c.match(array("q", [1]), [0])
    assert type(make_kv_event_index(64)) is CompiledKVEventIndex
    assert type(make_kv_event_index(65)) is ShardedKVEventIndex
    assert [type(t) for t in make_kv_event_index(130).shards] == [CompiledKVEventIndex] * 3  # type: ignore[attr-defined]
    assert type(make_kv_event_index(4, compiled=False)) is KVEventIndex


WIDE_N = 150  # three tables: 64, 64 and 22 replicas


@st.composite
def wide_calls(draw: st.DrawFn) -> list[tuple]:
    out = []
    replicas = st.integers(0, WIDE_N - 1)
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["store", "store", "remove", "clear", "match"]))
        if kind == "clear":
            out.append((kind, draw(replicas)))
        elif kind == "match":
            out.append((kind, draw(st.lists(HASHES, max_size=12)), draw(st.lists(replicas, max_size=40))))
        else:
            out.append((kind, draw(replicas), draw(st.lists(HASHES, max_size=30))))
    return out


@settings(max_examples=200, deadline=None)
@given(wide_calls())
def test_the_sharded_index_answers_as_the_python_one(seq: list[tuple]) -> None:
    """More than 64 replicas: compiled tables of 64 each, matches merged in the oracle's order."""
    py = KVEventIndex(WIDE_N)
    c = ShardedKVEventIndex(WIDE_N, lambda n: CompiledKVEventIndex(n, initial_slots=8))
    for call in seq:
        _call_both(py, c, call)
    assert [c.num_entries(r) for r in range(WIDE_N)] == [py.num_entries(r) for r in range(WIDE_N)]
    everyone = list(range(WIDE_N))
    assert [list(c.match([h], everyone).items()) for h in UNIVERSE] == [list(py.match([h], everyone).items())
                                                                         for h in UNIVERSE]
    for bad in (-1, WIDE_N):
        with pytest.raises(IndexError):
            c.store(bad, [1])
