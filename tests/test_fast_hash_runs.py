"""The fast hash over runs of consecutive ids: a prompt held as runs hashes to exactly the keys of
the same tokens given as an array (whatever the run boundaries), and the consecutive-block digest
keeps the equality structure (same tokens <=> same key)."""

from __future__ import annotations

from array import ArrayType

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.core.hashing import FastBlockHasher
from sim.core.request import Request, slice_runs
from workloads.tokens import RunTokens, TaggedTokens

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

# runs that often touch (the next run starts where one ends) or repeat, over a small id range, so
# blocks across run boundaries are sometimes consecutive and sometimes not
_run = st.tuples(st.integers(0, 60), st.integers(1, 40))


@st.composite
def run_lists(draw):
    runs = draw(st.lists(_run, min_size=1, max_size=8))
    out = []
    for start, n in runs:
        if out and draw(st.booleans()):
            start = out[-1][0] + out[-1][1]  # touching
        out.append((start, n))
    return out


def _unmerged(runs) -> RunTokens:
    """RunTokens without fusing touching runs (as a loader may hand them over)."""
    return RunTokens(np.array([s for s, _ in runs]), np.array([n for _, n in runs]))


def _keys(hasher, tokens, uid=0, **kw):
    return Request("r", tokens, 1, uid=uid, hasher=hasher, **kw).block_hashes


@SETTINGS
@given(runs=run_lists(), bs=st.sampled_from([1, 2, 4, 16]), salt=st.sampled_from([None, "s"]))
def test_runs_and_arrays_hash_alike(runs, bs, salt):
    hasher = FastBlockHasher(bs, 0)
    lazy = _unmerged(runs)
    arr = lazy.materialize()
    want = _keys(hasher, arr, cache_salt=salt)
    assert _keys(hasher, lazy, cache_salt=salt) == want
    assert _keys(hasher, RunTokens.of(*runs), cache_salt=salt) == want  # merged runs
    assert hasher.hash_token_blocks(lazy) == hasher.hash_token_blocks(arr) == _keys(hasher, arr)


@SETTINGS
@given(runs=run_lists(), pos=st.integers(0, 200), tag=st.integers(0, 100))
def test_tagged_runs_hash_like_the_array(runs, pos, tag):
    hasher = FastBlockHasher(4, 0)
    inner = _unmerged(runs)
    pos = min(pos, len(inner))
    tagged = TaggedTokens(inner, pos, tag)
    assert tagged.runs() is not None
    assert _keys(hasher, tagged) == _keys(hasher, tagged.materialize())


@SETTINGS
@given(a=st.lists(st.integers(0, 30), min_size=8, max_size=8), b=st.lists(st.integers(0, 30), min_size=8, max_size=8))
def test_block_keys_equal_iff_tokens_equal(a, b):
    hasher = FastBlockHasher(8, 0)
    assert (hasher.hash_token_blocks(a) == hasher.hash_token_blocks(b)) == (a == b)


def test_consecutive_and_scrambled_blocks_differ():
    hasher = FastBlockHasher(4, 0)
    run = [10, 11, 12, 13]
    others = ([10, 11, 13, 12], [10, 10, 10, 10], [11, 12, 13, 14], [9, 10, 11, 12])
    keys = {tuple(hasher.hash_token_blocks(t)) for t in [run, *others]}
    assert len(keys) == 5


def test_appended_outputs_continue_the_chain_from_runs():
    """A request whose prompt is runs and whose trace gives its outputs: the blocks after the
    prompt are hashed from tokens, continuing the same chain as an array prompt."""
    hasher = FastBlockHasher(4, 0)
    outs = [500, 501, 502, 7, 8, 9, 10, 11]
    reqs = [Request("r", p, len(outs), uid=1, hasher=hasher, output_token_ids=outs)
            for p in (RunTokens.of((100, 10)), np.arange(100, 110))]
    for r in reqs:
        assert r.block_hashes  # hash the prompt now
        r.append_output_token_ids(outs)
    assert reqs[0].block_hashes == reqs[1].block_hashes and len(reqs[0].block_hashes) == 4


def test_slice_runs():
    starts, lengths = np.array([10, 50, 90]), np.array([5, 3, 4])  # tokens 10..14, 50..52, 90..93
    s, n = slice_runs(starts, lengths, 3, 10)
    tokens = np.concatenate([np.arange(a, a + k) for a, k in zip(s, n)])
    assert tokens.tolist() == [13, 14, 50, 51, 52, 90, 91]


@pytest.mark.parametrize("runs", [((2**62 - 2, 4),), ((5, 2), (2**62 - 2, 3)), ((-1, 2),), ((3, 1), (-4, 2))])
def test_runs_are_range_checked(runs):
    r = Request("r", RunTokens.of(*runs), 1, hasher=FastBlockHasher(2, 0))
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 2\*\*62\)"):
        assert r.block_hashes


def test_runs_may_end_at_the_last_prompt_id():
    """Ids up to 2**62 - 1 are prompt ids: a run ending there passes the check."""
    r = Request("r", RunTokens.of((7, 2), (2**62 - 2, 2)), 1, hasher=FastBlockHasher(2, 0))
    assert len(r.block_hashes) == 2


@SETTINGS
@given(runs=run_lists(), bs=st.sampled_from([1, 3, 4, 16]), cut=st.integers(0, 100))
def test_compiled_chain_equals_numpy_chain(runs, bs, cut):
    """The compiled chain (sim.core.compiled_hash) and the numpy oracle give the same keys and
    chain state, from the start of a prompt and resumed mid-prompt."""
    pytest.importorskip("sim.core.compiled_hash")
    got = []
    for compiled in (True, False):
        hasher = FastBlockHasher(bs, 7)
        hasher.compiled = compiled
        lazy = _unmerged(runs)
        n = len(lazy) // bs
        first = min(cut // bs, n)
        starts, lengths = lazy.runs()
        head = ([], hasher.initial_state)
        if first:
            head = hasher._chain_runs(starts, lengths, first, hasher.initial_state, None)
        rest = ([], head[1])
        if n > first:
            rest = hasher._chain_runs(*slice_runs(starts, lengths, first * bs, n * bs), n - first, head[1], None)
        got.append((head[0] + rest[0], rest[1], hasher.hash_token_blocks(lazy)))
    assert got[0] == got[1]


@SETTINGS
@given(runs=run_lists(), bs=st.sampled_from([1, 3, 16]), salt=st.sampled_from([None, "", "s"]),
       lookahead=st.sampled_from([0, 2]), array=st.booleans())
def test_prompt_event_hashes_in_c_equal_the_converted_keys(runs, bs, salt, lookahead, array):
    """A router's prompt hashes (``prompt_external_hashes``: the compiled chain's keys, their event
    forms as words and the chain state) are the request's own keys and state, and ``external_block_hash`` of
    them, wherever given; None where the keys must be converted (extra keys, lookahead, an expanded
    prompt)."""
    from sim.core.hashing import external_block_hash

    pytest.importorskip("sim.core.compiled_hash")
    hasher = FastBlockHasher(bs, 7, num_lookahead_tokens=lookahead)
    lazy = _unmerged(runs)
    tokens = lazy.materialize() if array else lazy
    made = hasher.prompt_external_hashes(Request("r", tokens, 1, cache_salt=salt, hasher=hasher))
    plain = not salt and not lookahead and not array and len(lazy) >= bs
    assert (made is None) == (not plain)
    if made is not None:
        keys, ext, state = made
        r = Request("r", tokens, 1, cache_salt=salt, hasher=hasher)
        assert keys == r.block_hashes and state == r.hash_state
        # as an array('Q'): no int object per block (RouterRequest.words; the compiled index reads it in place)
        assert type(ext) is ArrayType and ext.typecode == "Q" and ext.tolist() == [external_block_hash(k) for k in keys]
