# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled decode window: ``sim.replay.decode_window._bulk_window``'s step loop in C, writing
each step's duration and start into ``array('d')`` buffers, and a window's rows appended to the
step table in one call (mirrors nothing in vLLM: the simulator's own fast-forward).

A bulk window -- every running request decodes one token per step, nothing else runs -- prices
each step and advances the clock by it until the window must end (the next arrival, the free
blocks, a request's last token). A 16-replica fleet on the first 2,000 Mooncake requests plays
575 k such steps; in the compiled planner each one cost ~650 instructions, two float objects
(duration, start) made, kept in lists until the step table converted them back to doubles, and
freed. Here a step is a few dozen instructions and no object: the two columns are C arrays the
step table copies as they are (``sim.replay.column_table.NumericColumnTable``: an ``array('d')``
of its own type is appended by one copy).

Same results, bit for bit, as the Python loop, its oracle (a property test drives both): the same
stops in the same order, the blocks each step allocates counted the same way (a decoder whose first
allocation is at step ``f`` allocates at ``f, f + bs, ...``: per step, the decoders whose first
step is at most ``j`` and congruent to ``j`` modulo ``bs``), and each duration
``sim.core.step_price.RooflinePrice.step_time``'s operations on C doubles in its order (IEEE double;
no fused multiply-add: the build targets no FMA unit), each start the previous one plus it.

:func:`put_columns` appends a window's rows to the step table's columns
(``sim.replay.column_table.NumericColumnTable.extend``) without a Python call per column: arrays
by one copy, lists of exact numbers and ranges converted in C (before: ``struct`` packing per list
and a Python ``_put`` call per column, ~30 us a window, 4,086 windows in that fleet). What it does
not take -- a value ``struct`` would refuse, any other kind of column -- it leaves to ``_put``. A
column grows to its exact new length (``array.resize``; ``array`` itself keeps a sixteenth more,
Cython's ``resize_smart`` half again, which the step table's full chunks would hold for good: +24 MiB
and +6k page faults in that fleet).
Imports nothing from the project.
"""

from cpython cimport array
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsDouble, PyLong_AsLongLongAndOverflow
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

import array as _array_mod

cdef array.array _DOUBLES = _array_mod.array("d")
cdef object _array_type = _array_mod.array


cdef int _cmp_ll(const void *a, const void *b) noexcept nogil:
    cdef long long x = (<const long long *>a)[0]
    cdef long long y = (<const long long *>b)[0]
    return (x > y) - (x < y)


def bulk_steps(object price, long long n_bulk, long long ctx, long long k_max, long long free_blocks,
               list firsts, long long bs, double now, double next_arrival, bint stop_at_arrival,
               bint observed):
    """``(durations, starts)`` of a bulk window as ``array('d')`` (``starts`` one longer: each
    step's start, then the window's end): ``_bulk_window``'s loop (see its docstring) with
    ``price`` a ``RooflinePrice``; fewer than 2 durations means no window."""
    cdef double dense = price.dense, lm_head = price.lm_head, attn = price.attn
    cdef double flops_per_s = price.flops_per_s, weights = price.weights, kv = price.kv
    cdef double bytes_per_s = price.bytes_per_s, overhead_s = price.overhead_s
    cdef Py_ssize_t n = len(firsts), i = 0, cap = 64, k = 0
    cdef long long j, need, used = 0
    cdef double start = now, d, flops, compute, memory
    cdef long long *sorted_firsts = <long long *>malloc(max(n, 1) * sizeof(long long))
    cdef long long *per_residue = <long long *>malloc(max(bs, 1) * sizeof(long long))
    if sorted_firsts == NULL or per_residue == NULL:
        free(sorted_firsts)
        free(per_residue)
        raise MemoryError()
    for i in range(n):
        sorted_firsts[i] = firsts[i]
    for i in range(bs):
        per_residue[i] = 0
    qsort(sorted_firsts, n, sizeof(long long), _cmp_ll)
    if cap > k_max:
        cap = max(k_max, 1)
    cdef array.array durations = array.clone(_DOUBLES, cap, zero=False)
    cdef array.array starts = array.clone(_DOUBLES, cap + 1, zero=False)
    starts.data.as_doubles[0] = now
    i = 0
    try:
        for j in range(k_max):
            if j and stop_at_arrival and start >= next_arrival:  # next_arrival has the tolerance
                break
            while i < n and sorted_firsts[i] <= j:  # decoders allocating from step j on, every bs steps
                per_residue[sorted_firsts[i] % bs] += 1
                i += 1
            need = per_residue[j % bs]
            if used + need > free_blocks:
                break
            # RooflinePrice.step_time(n_bulk, n_bulk, ctx, ctx + n_bulk), operation for operation
            flops = dense * <double>n_bulk + lm_head * <double>n_bulk + attn * <double>(ctx + n_bulk)
            compute = flops / flops_per_s
            memory = (weights + kv * <double>(ctx + 2 * n_bulk)) / bytes_per_s
            d = (compute if compute > memory else memory) + overhead_s
            if observed and start + d >= next_arrival:
                break  # an observed window is over before the next arrival
            used += need
            if k == cap:
                cap *= 2
                array.resize(durations, cap)
                array.resize(starts, cap + 1)
            durations.data.as_doubles[k] = d
            start = start + d  # the same float arithmetic as the plain loop's clock
            k += 1
            starts.data.as_doubles[k] = start
            ctx += n_bulk
    finally:
        free(sorted_firsts)
        free(per_residue)
    array.resize(durations, k)
    array.resize(starts, k + 1)
    return durations, starts


def put_columns(list cols, tuple columns):
    """Append ``columns[i]`` to the array ``cols[i]`` (int64 ``'q'`` or float64 ``'d'``), in order,
    while each can be done here without a Python call per value, and return how many were: an array
    of the column's own type (one copy), a list of exact ``int`` (``'q'``, each within int64) or of
    exact ``float`` and ``int`` (``'d'``, an int as its nearest double), a ``range`` of step 1 into
    ``'q'`` (within int64). The first column that is none of these is left as it was, and so are
    the ones after it: the caller appends them (``sim.replay.column_table._put``, whose conversions
    -- ``struct``'s -- give these same values, and whose refusals it handles)."""
    cdef Py_ssize_t i, j, n, done = 0
    cdef array.array col, other
    cdef object values
    cdef list items
    cdef long long v, start
    cdef int overflow
    cdef char code
    for i in range(min(len(cols), len(columns))):
        col = <array.array>cols[i]
        values = columns[i]
        code = col.ob_descr.typecode_char
        if type(values) is _array_type:
            other = <array.array>values
            if other.ob_descr.typecode != code:
                return done
            start = len(col)
            n = len(other)
            array.resize(col, start + n)  # (exact: see the module docstring)
            memcpy(col.data.as_chars + start * col.ob_descr.itemsize, other.data.as_chars, n * col.ob_descr.itemsize)
        elif type(values) is list:
            items = <list>values
            n = len(items)
            if code == b"q":
                for j in range(n):  # checked first: a refused value leaves the column as it was
                    if type(items[j]) is not int:
                        return done
                start = len(col)
                array.resize(col, start + n)  # (exact: see the module docstring)
                for j in range(n):
                    v = PyLong_AsLongLongAndOverflow(items[j], &overflow)
                    if overflow:
                        array.resize(col, start)
                        return done
                    col.data.as_longlongs[start + j] = v
            elif code == b"d":
                for j in range(n):
                    if type(items[j]) is not float and type(items[j]) is not int:
                        return done
                start = len(col)
                array.resize(col, start + n)  # (exact: see the module docstring)
                for j in range(n):
                    if type(items[j]) is float:
                        col.data.as_doubles[start + j] = PyFloat_AS_DOUBLE(items[j])
                    else:
                        try:
                            col.data.as_doubles[start + j] = PyLong_AsDouble(items[j])
                        except OverflowError:  # beyond a double: the caller refuses it
                            array.resize(col, start)
                            return done
            else:
                return done
        elif type(values) is range and code == b"q":
            if values.step != 1 or values.start < -(2**63) or values.stop > 2**63:
                return done
            start = len(col)
            n = len(values)
            v = values.start
            array.resize(col, start + n)  # (exact: see the module docstring)
            for j in range(n):
                col.data.as_longlongs[start + j] = v + j
        else:
            return done
        done += 1
    return done
