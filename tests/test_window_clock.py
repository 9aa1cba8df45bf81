"""A fast-forward window lands the clock on the very float the plain loop's step-by-step clock
reaches (``sim.replay.sync_loop.window_waits``): the plain loop adds each step's duration to
SimPy's ``now``; the window waits once, ``d`` with ``now + d == end`` -- and when no such ``d``
exists, waits the steps' durations themselves. One ulp off would move every later step start,
and with it which requests a step sees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.replay.sync_loop import exact_delay, window_waits


def _clock_after(now: float, waits: list[float]) -> float:
    """The clock after waiting ``waits`` from ``now``, as SimPy adds them (a timeout at now + delay);
    waiting a window's step durations is the plain loop's clock."""
    for d in waits:
        now = now + d
    return now


# a window that starts 37.2 ms into a replay and lasts six steps (found by a search over
# 4-decimal starts and durations): no single wait from its start lands on its end
_NOW = 0.0372
_DURATIONS = [0.037, 0.0304, 0.0329, 0.0273, 0.0289, 0.04]


def test_a_window_end_that_no_single_wait_reaches() -> None:
    end = _clock_after(_NOW, _DURATIONS)
    assert end == 0.2337
    assert exact_delay(_NOW, end) is None  # the wait the window used to take landed one ulp off
    d = end - _NOW
    assert _NOW + d != end
    waits = window_waits(_NOW, end, _DURATIONS)
    assert waits == _DURATIONS  # the plain loop's additions, one by one
    assert _clock_after(_NOW, waits) == end


def test_a_late_window_waits_once() -> None:
    # past half of its end, end - now is exact (Sterbenz): one wait, and it is the difference
    now = 1234.5678
    end = _clock_after(now, _DURATIONS)
    assert window_waits(now, end, _DURATIONS) == [end - now]


@settings(max_examples=800, deadline=None)
@given(now=st.one_of(st.just(0.0), st.floats(0.0, 0.3), st.floats(0.0, 5000.0)),
       durations=st.lists(st.floats(1e-4, 0.2), min_size=1, max_size=60))
def test_window_waits_land_where_the_plain_loop_lands(now: float, durations: list[float]) -> None:
    end = _clock_after(now, durations)
    waits = window_waits(now, end, durations)
    assert _clock_after(now, waits) == end
    assert len(waits) == 1 or exact_delay(now, end) is None
