"""The compiled bulk decode window (``sim.replay.compiled_window.bulk_steps``) plays the steps of
``sim.replay.decode_window._bulk_loop``, its oracle, bit for bit: the same number of steps (the
same stop: arrival, free blocks, an observed window's end) and the same durations and starts, as
doubles, for random windows. Skipped where the extension is not built."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.replay.decode_window import _bulk_loop
from sim.timing.roofline import RooflineLatency, list_gpu_specs, list_model_specs

compiled_window = pytest.importorskip("sim.replay.compiled_window")

_PRICES = [RooflineLatency.from_names(m, g).step_price() for m in list_model_specs()[:3] for g in list_gpu_specs()[:3]]


def _unpriced(shape: object, step: int) -> float:
    raise AssertionError("the step price is given: no per-shape price")


@settings(max_examples=400, deadline=None)
@given(
    price=st.sampled_from(_PRICES),
    n_bulk=st.integers(1, 300),
    ctx=st.integers(0, 1 << 22),
    k_max=st.integers(0, 700),
    free=st.integers(0, 120),
    bs=st.sampled_from([1, 2, 16, 64, 512]),
    firsts=st.lists(st.integers(0, 600), max_size=40),
    now=st.floats(0.0, 1e4),
    gap=st.one_of(st.floats(0.0, 5.0), st.just(float("inf"))),
    stop_at_arrival=st.booleans(),
    observed=st.booleans(),
)
def test_compiled_bulk_steps_are_the_python_loops(price, n_bulk, ctx, k_max, free, bs, firsts, now, gap,
                                                  stop_at_arrival, observed) -> None:
    next_arrival = now + gap
    want_d, want_s = _bulk_loop(7, n_bulk, bs, firsts, [], ctx, k_max, free, _unpriced, price, now, next_arrival,
                                stop_at_arrival, observed)
    got_d, got_s = compiled_window.bulk_steps(price, n_bulk, ctx, k_max, free, firsts, bs, now, next_arrival,
                                              stop_at_arrival, observed)
    assert isinstance(got_d, array) and got_d.typecode == "d" and got_s.typecode == "d"
    assert [x.hex() for x in got_d] == [x.hex() for x in want_d]
    assert [x.hex() for x in got_s] == [x.hex() for x in want_s]


def test_a_long_window_grows_its_buffers() -> None:
    price = _PRICES[0]
    want_d, want_s = _bulk_loop(0, 8, 16, [3] * 8, [], 1000, 5000, 10**6, _unpriced, price, 1.0, float("inf"),
                                True, False)
    got_d, got_s = compiled_window.bulk_steps(price, 8, 1000, 5000, 10**6, [3] * 8, 16, 1.0, float("inf"), True, False)
    assert len(got_d) == 5000 and list(got_d) == want_d and list(got_s) == want_s


_VALUES = st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=False), st.booleans(), st.none())


@st.composite
def _column(draw: st.DrawFn) -> object:
    kind = draw(st.sampled_from(["ints", "floats", "mixed", "array_q", "array_d", "range", "tuple"]))
    if kind == "ints":
        return draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6))
    if kind == "floats":
        return draw(st.lists(st.one_of(st.floats(), st.integers(-(2**70), 2**70)), max_size=6))
    if kind == "mixed":
        return draw(st.lists(_VALUES, max_size=6))
    if kind == "array_q":
        return array("q", draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6)))
    if kind == "array_d":
        return array("d", draw(st.lists(st.floats(), max_size=6)))
    if kind == "range":
        start = draw(st.integers(-(2**64), 2**64))
        return range(start, start + draw(st.integers(0, 5)), draw(st.sampled_from([1, 1, 2])))
    return tuple(draw(st.lists(st.integers(0, 99), max_size=4)))


@settings(max_examples=400, deadline=None)
@given(codes=st.lists(st.sampled_from("qd"), min_size=1, max_size=6), data=st.data())
def test_put_columns_appends_what_put_would_and_stops_at_the_first_it_leaves(codes, data) -> None:
    """put_columns (a window's step columns in C) against column_table._put, its oracle: the columns
    it reports done hold what _put appends (same values, float bits included); the rest, from the
    first one it leaves, are untouched."""
    from sim.replay.column_table import _put

    columns = tuple(data.draw(_column()) for _ in codes)
    base = [array(c, [1] if c == "q" else [0.5]) for c in codes]
    got = [array(c, a) for c, a in zip(codes, base, strict=True)]
    done = compiled_window.put_columns(got, columns)
    assert 0 <= done <= len(codes)
    for i, (c, values) in enumerate(zip(codes, columns, strict=True)):
        want = array(c, base[i])
        if i < done:
            _put(want, values)  # (a column put_columns took, _put takes too)
            assert want.tobytes() == got[i].tobytes()
        else:
            assert got[i].tobytes() == want.tobytes()
