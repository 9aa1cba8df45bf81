"""A ``BlockStored``'s token ids (``sim.core.token_span.TokenSpan``) behave as the list vLLM's event
carries: equal to it both ways, the same length, items, slices, printout, pickle and JSON, and
unchanged by what happens to the request afterwards."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

from sim.core.hashing import make_block_hasher
from sim.core.kv_events import BlockStored, event_to_dict
from sim.core.request import GENERATED_TOKEN_BASE, Request
from sim.core.token_span import TokenSpan

IDS = [5, 6, 7, 100, 101]


def _span() -> TokenSpan:
    return TokenSpan(np.array([5, 6, 7], dtype=np.int64), range(100, 102))


def test_a_span_is_the_list_of_its_ids() -> None:
    s = _span()
    assert len(s) == 5
    assert s == IDS and IDS == s and s == tuple(IDS) and s == _span()
    assert s != IDS[:-1] and IDS[:-1] != s and s != [5, 6, 7, 100, 102]
    assert s[0] == 5 and s[-1] == 101 and s[1:3] == [6, 7] and list(s) == IDS
    assert repr(s) == repr(IDS) and all(type(x) is int for x in s.tolist())
    with pytest.raises(TypeError):
        hash(s)


def test_it_pickles_deep_copies_and_serialises_as_a_plain_list() -> None:
    s = _span()
    assert type(pickle.loads(pickle.dumps(s))) is list and pickle.loads(pickle.dumps(s)) == IDS
    assert type(copy.deepcopy(s)) is list
    ev = BlockStored([1, 2], None, s, 16, None)
    d = event_to_dict(ev)
    assert type(d["token_ids"]) is list and json.loads(json.dumps(d))["token_ids"] == IDS
    assert ev == BlockStored([1, 2], None, IDS, 16, None)  # an event equals the one with the list
    assert pickle.loads(pickle.dumps(ev)) == ev


def test_trace_given_outputs_become_python_ints() -> None:
    s = TokenSpan(np.array([1], dtype=np.int64), [np.int64(9), 10])
    assert s.tolist() == [1, 9, 10] and all(type(x) is int for x in s.tolist())


def test_a_span_outlives_the_request_it_was_cut_from() -> None:
    prompt = np.arange(1000, 1040, dtype=np.int64)
    r = Request("r", prompt, 8, hasher=make_block_hasher("fast", 16))
    r.append_output_token_ids(range(GENERATED_TOKEN_BASE, GENERATED_TOKEN_BASE + 8))
    spans = {(a, b): r.token_span(a, b) for a, b in [(0, 32), (16, 44), (40, 48), (0, 0)]}
    expect = {k: r.token_slice(*k).tolist() for k in spans}
    r.release_tokens()  # a finished request drops its token storage; events sent before keep theirs
    for k, span in spans.items():
        assert span == expect[k] and len(span) == k[1] - k[0]
