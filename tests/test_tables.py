"""The replay's tables without pandas (``sim.replay.table``, ``sim.replay.column_table``): as an
executable spec.

* ``Table.from_rows(...).to_frame()`` is ``DataFrame.from_records`` of the same rows -- dtypes,
  values, missing values -- for any mix of ints, floats, bools, strings, None and huge ints;
* a ``ColumnTable`` fed the same rows one by one or window by window (as columns) gives that same
  table, whatever the order of value types, and an extend that fails leaves it unchanged;
* a ``NumericColumnTable`` (the step table) fed rows of ints and floats, by rows or windows, gives
  the table a ``ColumnTable`` gives for them, and refuses a value that is no int64 or float64
  number with the table left as it was;
* a Table written by pyarrow from its buffers reads back as the DataFrame that pandas writes for
  it (NaN and None as null), and the summary of a Table equals the summary of its DataFrame, to
  the bit.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal

from sim.core.prefix_cache_stats import PrefixCacheStats
from sim.replay.column_table import ColumnTable, NumericColumnTable
from sim.replay.metrics import REQUEST_COLUMNS, finalize_requests, summarize
from sim.replay.table import Table, typed_column

VALUES = {
    "int": st.integers(-(2**40), 2**40),
    "float": st.floats(allow_nan=True, allow_infinity=False, width=64),
    "bool": st.booleans(),
    "none": st.none(),
    "str": st.text(max_size=4),
    "huge": st.integers(2**63, 2**64 - 1),
}
# a column draws its values from one to three of the kinds: uniform columns and every mix
COLUMN_KINDS = st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=3, unique=True)


@st.composite
def rows(draw: st.DrawFn, huge: bool = True) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
    kinds = draw(st.lists(COLUMN_KINDS, min_size=1, max_size=5).filter(lambda ks: huge or all("huge" not in k
                                                                                               for k in ks)))
    n = draw(st.integers(0, 12))
    cols = [[draw(st.one_of(*(VALUES[k] for k in ks))) for _ in range(n)] for ks in kinds]
    names = tuple(f"c{i}" for i in range(len(kinds)))
    return names, list(zip(*cols)) if n else []


@settings(max_examples=300, deadline=None)
@given(rows())
def test_a_table_is_the_frame_from_records_gives(case: tuple[tuple[str, ...], list[tuple[object, ...]]]) -> None:
    names, data = case
    want = pd.DataFrame.from_records(data, columns=list(names))
    assert_frame_equal(Table.from_rows(names, data).to_frame(), want)


@settings(max_examples=300, deadline=None)
@given(rows(), st.lists(st.integers(1, 5), max_size=6), st.sampled_from([1, 2, 3, 8192]))
def test_a_column_table_fed_rows_or_windows_is_the_same_table(case, cuts, chunk) -> None:
    import sim.replay.column_table as ct

    saved, ct.CHUNK_ROWS = ct.CHUNK_ROWS, chunk  # chunk boundaries anywhere
    try:
        _check_fed_rows_or_windows(case, cuts)
    finally:
        ct.CHUNK_ROWS = saved


def _fed_rows_and_windows(table, names, data, cuts, column=tuple):
    """Two ``table(names)``: one fed ``data`` row by row, one window by window (``cuts`` rows
    each, then the rest), a window's columns given as ``column(values)``."""
    by_row, by_window = table(names), table(names)
    for row in data:
        by_row.append(*row)
    at = 0
    for cut in [*cuts, len(data)]:
        window = data[at : at + cut]
        by_window.extend(*(map(column, zip(*window)) if window else [column() for _ in names]))
        at += len(window)
    return by_row, by_window


def _check_fed_rows_or_windows(case, cuts) -> None:
    names, data = case
    by_row, by_window = _fed_rows_and_windows(ColumnTable, names, data, cuts)
    want = pd.DataFrame.from_records(data, columns=list(names))
    assert len(by_row) == len(by_window) == len(data)
    assert_frame_equal(by_row.to_table().to_frame(), want)
    assert_frame_equal(by_window.to_table().to_frame(), want)


def test_typed_columns_are_numpy_where_pandas_infers_a_number() -> None:
    assert typed_column([1, 2]).dtype == np.int64
    assert typed_column([1, 2.5]).dtype == np.float64
    assert np.isnan(typed_column([1, None])[1])
    assert typed_column([True, False]).dtype == np.bool_
    for mixed in ([True, 2], ["a", None], [None, None], [2**63], [np.int64(1)], []):
        assert isinstance(typed_column(mixed), list), mixed


def test_a_refused_row_or_window_leaves_the_table_as_it_was() -> None:
    t = ColumnTable(("a", "b"))
    t.append(1, 2.0)
    with pytest.raises(ValueError, match="unequal length"):
        t.extend([1, 2], iter([3.0]))
    with pytest.raises(ValueError, match="1 columns given for 2"):
        t.extend([1])
    with pytest.raises(ValueError, match="a row of 1 values for 2 columns"):
        t.append(1)
    assert len(t) == 1 and t.to_table().to_frame().dtypes.to_dict() == {"a": np.int64, "b": np.float64}
    t.extend([2, 3.5], [1.0, 2.0])  # ints then a float: the column is float64, every value kept
    assert t.to_table().to_frame().to_dict("list") == {"a": [1.0, 2.0, 3.5], "b": [2.0, 1.0, 2.0]}


@pytest.mark.parametrize("chunk", [1, 2, 3, 1000])
def test_chunk_boundaries_do_not_change_the_table(monkeypatch, chunk: int) -> None:
    import sim.replay.column_table as ct

    monkeypatch.setattr(ct, "CHUNK_ROWS", chunk)  # (as the property above, on values it may not draw)
    data = [(1, 0.5, True, "x"), (2, None, False, None), (2**63, 1.5, True, "y"), (3, 2.0, 1, "z"), (4, 2, True, "")]
    for n in range(len(data) + 1):
        t = ColumnTable(("i", "f", "b", "s"))
        for row in data[:n]:
            t.append(*row)
        assert_frame_equal(t.to_table().to_frame(), pd.DataFrame.from_records(data[:n], columns=["i", "f", "b", "s"]))


MIXED = Table({
    "i": np.array([1, 2, 3]), "f": np.array([0.5, math.nan, 2.0]), "b": np.array([True, False, True]),
    "s": ["x", None, "é"], "none": [None, None, None], "strs": ["", "a", "bc"], "mixed": [1, "a", None],
})


def test_a_table_written_by_pyarrow_reads_back_as_the_frame_pandas_writes(tmp_path) -> None:
    import pyarrow.parquet as pq

    for table in (MIXED, Table({c: MIXED[c] for c in MIXED if c != "mixed"})):
        try:
            arrow = table.to_arrow()
        except Exception:  # the mixed column: results.py hands such a table to pandas
            assert "mixed" in table
            continue
        pq.write_table(arrow, tmp_path / "ours.parquet")
        table.to_frame().to_parquet(tmp_path / "pandas.parquet", index=False)
        ours, theirs = pd.read_parquet(tmp_path / "ours.parquet"), pd.read_parquet(tmp_path / "pandas.parquet")
        assert_frame_equal(ours, theirs)
        assert arrow.column("f").null_count == 1 and arrow.column("s").null_count == 1  # NaN / None as null
        assert "mixed" not in table


def _requests(n: int, seed: int) -> list[tuple[object, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rejected = rng.random() < 0.2
        arrival = float(rng.random() * 10)
        t = [arrival + float(rng.random()) for _ in range(3)]
        t.sort()
        times = (None, None, None) if rejected else tuple(t)
        outputs = int(rng.integers(1, 4))
        out.append((f"r{i}", arrival, *times, int(rng.integers(1, 100)), outputs, None if rejected else
                    int(rng.integers(0, 50)), 0, "", None, None, None, None, False,
                    "rejected" if rejected else "finished", "never_fits_pool: x" if rejected else "",
                    "" if rejected else "max_tokens"))
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [0, 1, 5, 40])
def test_the_summary_of_a_table_is_the_summary_of_its_frame(seed: int, n: int) -> None:
    data = _requests(n, seed)
    steps = Table.from_rows(("batch_size",), [(int(b),) for b in np.random.default_rng(seed).integers(1, 9, 30)])
    table = finalize_requests(Table.from_rows(REQUEST_COLUMNS, data))
    frame = finalize_requests(pd.DataFrame.from_records(data, columns=list(REQUEST_COLUMNS)))
    assert_frame_equal(table.to_frame() if isinstance(table, Table) else table, frame)
    kw = {"sim_time_s": 1.0, "num_evictions": 0}
    ours = summarize(table, steps, PrefixCacheStats(), **kw)
    assert summarize(frame, steps.to_frame(), PrefixCacheStats(), **kw).keys() == ours.keys()
    theirs = _pandas_figures(frame, steps.to_frame())
    for k, v in theirs.items():  # to the bit (NaN equal to NaN)
        assert ours[k] == v or (math.isnan(v) and math.isnan(ours[k])), (k, ours[k], v)
        assert summarize(frame, steps.to_frame(), PrefixCacheStats(), **kw)[k] == ours[k] or math.isnan(v), k


def _pandas_figures(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, float]:
    """The summary figures as pandas computes them (the summary before Tables): the reference."""
    requests = requests[requests["status"] != "rejected"]
    n = len(requests)
    out = {"num_requests": n, "mean_batch_size": float(steps["batch_size"].mean()) if len(steps) else 0.0}
    if not n:
        return out
    out |= {"prompt_tokens": int(requests["prompt_tokens"].sum()), "num_preemptions": 0,
            "num_requests_with_hit": int((requests["hit_tokens"] > 0).sum())}
    span = float(requests["finish"].max()) - float(requests["arrival"].min())
    out["throughput_requests_per_s"] = n / span if span > 0 else math.nan
    for metric in ("ttft", "tpot", "e2e", "queue_time"):
        col = requests[metric]
        out[f"{metric}_mean_s"] = float(col.mean())
        for q in (50, 90, 99):
            s = col.dropna()
            out[f"{metric}_p{q}_s"] = float(np.percentile(s, q)) if len(s) else math.nan
    return out


NUMBERS = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=True, allow_infinity=True, width=64),
    "small": st.integers(0, 300),  # (CPython's cached ints)
}


@st.composite
def numeric_rows(draw: st.DrawFn) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
    kinds = draw(st.lists(st.lists(st.sampled_from(sorted(NUMBERS)), min_size=1, max_size=3, unique=True),
                          min_size=1, max_size=5))
    n = draw(st.integers(0, 12))
    cols = [[draw(st.one_of(*(NUMBERS[k] for k in ks))) for _ in range(n)] for ks in kinds]
    return tuple(f"c{i}" for i in range(len(kinds))), list(zip(*cols)) if n else []


def _numeric_tables(names, data, cuts) -> tuple[NumericColumnTable, NumericColumnTable]:
    return _fed_rows_and_windows(NumericColumnTable, names, data, cuts, column=list)  # (extend takes lists)


@settings(max_examples=300, deadline=None)
@given(numeric_rows(), st.lists(st.integers(1, 5), max_size=6))
def test_a_numeric_table_is_the_column_table_of_the_same_rows(case, cuts) -> None:
    names, data = case
    by_row, by_window = _numeric_tables(names, data, cuts)
    generic = ColumnTable(names)
    for row in data:
        generic.append(*row)
    want = generic.to_table().to_frame()
    assert_frame_equal(want, pd.DataFrame.from_records(data, columns=list(names)))
    assert len(by_row) == len(by_window) == len(data)
    assert_frame_equal(by_row.to_table().to_frame(), want)
    assert_frame_equal(by_window.to_table().to_frame(), want)


@settings(max_examples=200, deadline=None)
@given(numeric_rows(), st.sampled_from([None, "1", 2**1100, [1], complex(1, 1)]), st.data())
def test_a_numeric_table_refuses_what_is_no_number_and_stays_as_it_was(case, bad, data) -> None:
    names, rows_ = case
    table, _ = _numeric_tables(names, rows_, [])
    before = table.to_table().to_frame()
    width = len(names)
    col = data.draw(st.integers(0, width - 1))
    row = [data.draw(st.one_of(NUMBERS["float"], NUMBERS["small"])) for _ in range(width)]
    row[col] = bad
    with pytest.raises(ValueError, match=f"column 'c{col}': .* is not an int64 or float64 number"):
        table.append(*row)
    window = [[data.draw(st.one_of(NUMBERS["float"], NUMBERS["small"])) for _ in range(3)] for _ in range(width)]
    window[col][data.draw(st.integers(0, 2))] = bad
    with pytest.raises(ValueError, match=f"column 'c{col}'"):
        table.extend(*window)
    assert len(table) == len(rows_)
    assert_frame_equal(table.to_table().to_frame(), before)


def test_a_numeric_table_refuses_unequal_windows_and_wrong_widths() -> None:
    t = NumericColumnTable(("a", "b"))
    t.append(1, 2)
    with pytest.raises(ValueError, match="unequal length"):
        t.extend([1.5, 2], [3])  # (column a turned float64 on the way: restored)
    with pytest.raises(ValueError, match="1 columns given for 2"):
        t.extend([1])
    with pytest.raises(ValueError, match="a row of 1 values for 2 columns"):
        t.append(1)
    assert len(t) == 1 and t.to_table().to_frame().dtypes.to_dict() == {"a": np.int64, "b": np.int64}
    assert NumericColumnTable(("a",)).to_table().to_frame().equals(ColumnTable(("a",)).to_table().to_frame())


def test_an_int64_column_refuses_a_larger_int_a_float64_column_takes_it_as_a_float() -> None:
    t = NumericColumnTable(("i", "f"))
    t.append(1, 0.5)
    for big in (2**63, -(2**63) - 1):
        with pytest.raises(ValueError, match=f"column 'i': {big} is not an int64"):
            t.append(big, 0.5)
    t.append(2, 2**63)
    assert t.to_table().to_frame().to_dict("list") == {"i": [1, 2], "f": [0.5, 2.0**63]}


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_numeric_table_takes_array_columns_as_their_lists(data: st.DataObject) -> None:
    """A window's constant columns come as int64 arrays (``sim.replay.sync_loop``): the table equals
    the one fed the same values as lists, whether the column is int64 or float64 by then, and a
    refused window leaves it as it was."""
    from array import array

    width = data.draw(st.integers(1, 4))
    names = tuple(f"c{i}" for i in range(width))
    as_lists, as_arrays = NumericColumnTable(names), NumericColumnTable(names)
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.integers(1, 5))
        window: list[list[object]] = []
        for _ in range(width):
            if data.draw(st.booleans()):
                window.append([data.draw(NUMBERS["small"])] * k)
            else:
                window.append([data.draw(st.one_of(NUMBERS["float"], NUMBERS["small"])) for _ in range(k)])
        packed = [array("q", [int(v) for v in col])  # type: ignore[call-overload]  # (all ints here)
                  if all(type(v) is int for v in col) and data.draw(st.booleans()) else col for col in window]
        as_lists.extend(*window)
        as_arrays.extend(*packed)
        assert len(as_arrays) == len(as_lists)
    before = as_arrays.to_table().to_frame()
    assert_frame_equal(before, as_lists.to_table().to_frame())
    if width > 1:
        with pytest.raises(ValueError, match="unequal length"):
            as_arrays.extend(array("q", [1, 2]), *([[0.5]] * (width - 1)))
        assert_frame_equal(as_arrays.to_table().to_frame(), before)


@settings(max_examples=200, deadline=None)
@given(numeric_rows(), st.lists(st.integers(1, 5), max_size=6), st.integers(1, 4), st.data())
def test_a_numeric_table_in_small_chunks_is_the_same_table(case, cuts, chunk, data) -> None:
    """Columns cut into chunks of ``chunk`` rows (``NUMERIC_CHUNK_ROWS``, 512 in a replay) join
    into the same table, a column turned float64 after some chunks included, and a refused row or
    window after a cut leaves it as it was."""
    import sim.replay.column_table as column_table

    names, rows_ = case
    want = pd.DataFrame.from_records(rows_, columns=list(names))
    saved = column_table.NUMERIC_CHUNK_ROWS
    column_table.NUMERIC_CHUNK_ROWS = chunk
    try:
        by_row, by_window = _numeric_tables(names, rows_, cuts)
        for table in (by_row, by_window):
            assert_frame_equal(table.to_table().to_frame(), want)
            row = [data.draw(NUMBERS["small"]) for _ in names]
            row[data.draw(st.integers(0, len(names) - 1))] = None
            with pytest.raises(ValueError, match="is not an int64 or float64 number"):
                table.append(*row)
            with pytest.raises(ValueError, match="is not an int64 or float64 number"):
                table.extend(*([[v, 1.5]] for v in row))
            assert_frame_equal(table.to_table().to_frame(), want)
    finally:
        column_table.NUMERIC_CHUNK_ROWS = saved


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**40), 2**40), st.integers(0, 300), st.booleans())
def test_a_numeric_table_takes_a_range_as_its_values(first, k, floats_before) -> None:
    """A window's step indexes come as a ``range`` (``sim.replay.sync_loop``): the same table as
    their list, in an int64 column or one already float64."""
    by_range, by_list = NumericColumnTable(("step", "x")), NumericColumnTable(("step", "x"))
    for table in (by_range, by_list):
        table.append(0.5 if floats_before else 0, 1)
    by_range.extend(range(first, first + k), [2.5] * k)
    by_list.extend(list(range(first, first + k)), [2.5] * k)
    assert_frame_equal(by_range.to_table().to_frame(), by_list.to_table().to_frame())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(numeric_rows(), st.lists(st.integers(1, 5), max_size=6)), min_size=1, max_size=4),
       st.integers(2, 5))
def test_joined_numeric_tables_are_their_tables_concatenated(cases, chunk_rows) -> None:
    """join_numeric (a fleet's step columns in one copy) against each table's to_table, concatenated:
    the same columns when every table types a column alike, else None -- chunks cut every few rows."""
    import sim.replay.column_table as column_table

    names = ("a", "b")
    old = column_table.NUMERIC_CHUNK_ROWS
    column_table.NUMERIC_CHUNK_ROWS = chunk_rows
    try:
        tables = []
        for (_, rows), cuts in cases:
            rows = [(r[0], r[-1]) for r in rows] or [(1, 2.5)]  # two columns from the drawn ones
            tables.append(_numeric_tables(names, rows, cuts)[1])
    finally:
        column_table.NUMERIC_CHUNK_ROWS = old
    joined = column_table.join_numeric(tables)
    parts = [t.to_table() for t in tables]
    same = all(len({p[n].dtype for p in parts}) == 1 for n in names)
    assert (joined is not None) == same
    if joined is not None:
        for n, col in zip(names, joined, strict=True):
            want = np.concatenate([p[n] for p in parts])
            assert col.dtype == want.dtype
            np.testing.assert_array_equal(col, want)
