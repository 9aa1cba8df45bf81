"""A router's prompt hashes as words: ``RouterRequest.words`` gives the compiled chain's
``array('Q')`` (no int object per block) holding exactly the values of ``RouterRequest.hashes`` (the
list the other routers read, vLLM's event form of each block's key), and the compiled KV-event
index reads such an array in place with the answers it gives for the list."""

from __future__ import annotations

from array import ArrayType, array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.router import RouterRequest, external_block_hashes
from sim.core.hashing import make_block_hasher
from sim.core.request import Request
from workloads.tokens import RunTokens
from workloads.trace_format import TraceRequest

RUNS = st.lists(st.tuples(st.integers(0, 500), st.integers(1, 70)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(runs=RUNS, algo=st.sampled_from(["fast", "sha256"]), bs=st.sampled_from([4, 16]),
       salt=st.sampled_from([None, "s"]))
def test_words_hold_the_hashes_values(runs: list[tuple[int, int]], algo: str, bs: int, salt: str | None) -> None:
    tokens = RunTokens(np.array([s for s, _ in runs]), np.array([n for _, n in runs]))
    tr = TraceRequest("r", 0.0, tokens, 5, salt=salt)
    hasher = make_block_hasher(algo, bs, 3)
    want = external_block_hashes(Request("r", tokens, 5, cache_salt=salt, hasher=hasher).block_hashes)
    rr = RouterRequest(tr, 0)
    words = rr.words(hasher)
    assert list(words) == want and rr.words(hasher) is words  # memoised
    compiled = hasher.prompt_external_hashes(rr.probe(hasher)) is not None
    assert type(words) is (ArrayType if compiled else list)  # the plain path: the list itself
    assert not isinstance(words, ArrayType) or words.typecode == "Q"
    hashes = rr.hashes(hasher)
    assert type(hashes) is list and hashes == want and rr.hashes(hasher) is hashes


@settings(max_examples=200, deadline=None)
@given(stored=st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 12), max_size=12)), max_size=12),
       probe=st.lists(st.one_of(st.integers(0, 12), st.just(2**64 - 1)), max_size=14),
       candidates=st.lists(st.integers(0, 5), max_size=6))
def test_the_compiled_index_reads_words_as_the_list(stored: list[tuple[int, list[int]]], probe: list[int],
                                                   candidates: list[int]) -> None:
    compiled_index = pytest.importorskip("sim.cluster.compiled_index", reason="the Cython extension is not built")
    idx = compiled_index.CompiledKVEventIndex(6)
    for replica, hashes in stored:
        idx.store(replica, hashes)
    want = idx.match(probe, candidates)
    for form in (array("Q", probe), tuple(probe)):  # in place; any other sequence through a list
        got = idx.match(form, candidates)
        assert got == want and list(got.items()) == list(want.items())
