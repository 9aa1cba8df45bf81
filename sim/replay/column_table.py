"""A compact append-only table: typed numpy chunks per column (mirrors nothing in vLLM).

The step table of a replay: one row per engine step, all numbers, and many rows -- a fast-forward
window appends its steps as columns at once, and a fleet of 16 replicas records about 28 times the
steps of one engine. A row of Python objects costs ~0.6 KB where eight bytes per cell suffice, so
values are appended to plain lists (one per column: the cheapest append there is) and every
``CHUNK_ROWS`` rows each column's pending values become one numpy chunk where that loses nothing
-- ``int64`` for ints only, ``float64`` for floats only, ``bool`` for bools only -- and stay a list
otherwise. :meth:`ColumnTable.to_table` joins the chunks into the
:class:`~sim.replay.table.Table` of the same rows, and so the dtypes
``pandas.DataFrame.from_records`` would give them: numeric chunks are concatenated where pandas
would make the joined column numeric too (ints and floats: float64), anything else goes back to
Python values first and is typed as a whole (``typed_column``).

:class:`NumericColumnTable`, the step table's, holds numbers only, as ``array.array`` columns
converted as they are appended (no chunks, no compaction).

Invariants: rows keep their order; every column has ``len(table)`` values; ``to_table`` equals
``Table.from_rows`` of the same rows (a property test, chunk boundaries included); a refused row or
window (wrong width, unequal columns) leaves the table as it was. Imports numpy only.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from itertools import chain
from typing import Any

import numpy as np

from sim.replay.table import Column, Table, typed_column

_put_columns: Callable[[list[array[Any]], tuple[Sequence[Any], ...]], int] | None
try:  # a window's columns appended in C (sim.replay.compiled_window, built by pip install -e .)
    from sim.replay.compiled_window import put_columns as _put_columns
except ImportError:  # pragma: no cover - where the extension is not built
    _put_columns = None

CHUNK_ROWS = 8192  # rows of Python values a column holds before they become one numpy chunk
# rows of a NumericColumnTable's chunk (4 KiB a column). An open chunk grows by a fast-forward window's
# rows at a time (~150 in a fleet) and array over-allocates a sixteenth, so nearly every window's extend
# reallocates -- copies -- the open chunk: half a chunk on average, per column. 2048 rows copied 4x more;
# 256 makes the join (_joined) of 2x more chunks cost more than the copies it saves (callgrind, Dynamo
# 16 replicas, first 2,000 Mooncake requests, whole process: 2048 9,215 M, 1024 9,086 M, 512 9,051 M, 256 9,155 M)
NUMERIC_CHUNK_ROWS = 512


def _compact(values: list[Any]) -> Column:
    """``values`` as a numpy chunk where ``tolist()`` gives them back exactly, else the list."""
    types = set(map(type, values))
    if types == {float}:
        return np.array(values, dtype=np.float64)
    if types == {int}:
        try:
            return np.array(values, dtype=np.int64)  # exact for ints alone
        except OverflowError:  # one beyond int64
            return values
    if types == {bool}:
        return np.array(values, dtype=np.bool_)
    return values


def _join(chunks: list[Column]) -> Column:
    """One column from its chunks, typed as ``typed_column`` types all its values at once."""
    if len(chunks) == 1 and isinstance(chunks[0], np.ndarray):
        return chunks[0]
    kinds = {c.dtype.kind if isinstance(c, np.ndarray) else "O" for c in chunks}
    if kinds <= {"i", "f"} or kinds == {"b"}:  # pandas: ints with floats are float64
        return np.concatenate(chunks) if chunks else []
    return typed_column(list(chain.from_iterable(c.tolist() if isinstance(c, np.ndarray) else c for c in chunks)))


class ColumnTable:
    """Typed columns, appended row by row or window by window (see the module docstring)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._pending: list[list[Any]] = [[] for _ in columns]
        self._chunks: list[list[Column]] = [[] for _ in columns]
        self._n = 0

    def append(self, *values: Any) -> None:
        """One row, in ``columns`` order."""
        if len(values) != len(self.columns):
            raise ValueError(f"a row of {len(values)} values for {len(self.columns)} columns")
        any(map(list.append, self._pending, values))  # one C loop: append returns None, so any() sees all
        self._n += 1
        if len(self._pending[0]) >= CHUNK_ROWS:
            self._flush()

    def extend(self, *columns: Iterable[Any]) -> None:
        """Several rows given as columns, in ``columns`` order (a fast-forward window's steps)."""
        if len(columns) != len(self.columns):
            raise ValueError(f"{len(columns)} columns given for {len(self.columns)}")
        pending = self._pending
        before = len(pending[0])
        any(map(list.extend, pending, columns))  # as in append
        n = len(pending[0]) - before
        if any(len(col) - before != n for col in pending):
            lengths = [len(col) - before for col in pending]
            for col in pending:
                del col[before:]
            raise ValueError(f"columns of unequal length: {lengths}")
        self._n += n
        if before + n >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        for pending, chunks in zip(self._pending, self._chunks):
            if pending:
                chunks.append(_compact(pending))
        self._pending = [[] for _ in self.columns]

    def __len__(self) -> int:
        return self._n

    def to_table(self) -> Table:
        self._flush()
        return Table({name: _join(chunks) for name, chunks in zip(self.columns, self._chunks)})


_INT, _FLOAT = "q", "d"  # array typecodes: int64, float64
_REFUSED = (TypeError, OverflowError, struct.error)  # what a conversion raises for a value it cannot take
_PACKERS: dict[tuple[str, int], Callable[..., bytes]] = {}  # (typecode, n) -> a packer of n values


def _packer(code: str, n: int) -> Callable[..., bytes]:
    """``struct.Struct(f"{n}{code}").pack`` (native sizes: those of ``array``), made once per
    length: a fast-forward window's length repeats, and ``struct``'s own cache of formats is
    cleared whenever it fills."""
    pack = _PACKERS.get((code, n))
    if pack is None:
        pack = struct.Struct(f"{n}{code}").pack
        if len(_PACKERS) < 8192:
            _PACKERS[code, n] = pack
    return pack


def _put(col: array[Any], values: Sequence[Any]) -> None:
    """Append ``values`` to ``col``: a list packed in one C call (``struct``: a value's conversion
    is ``array``'s own -- an index for int64, ``PyFloat_AsDouble`` for float64 -- without the
    per-value argument parsing of ``fromlist``, three times its speed; it refuses what ``fromlist``
    refuses, appending nothing), an array of the column's own type copied as it is (a window's
    constant column, ``array("q", [v]) * k``: no value converted), a ``range`` (a window's step
    indexes) as its int64 values, any other sequence as its list."""
    if type(values) is list:
        col.frombytes(_packer(col.typecode, len(values))(*values))
    elif isinstance(values, array) and values.typecode == col.typecode:
        col.extend(values)
    elif type(values) is range and values.step == 1 and col.typecode == _INT and len(values):
        if values.start < -(2**63) or values.stop > 2**63:
            raise OverflowError(f"{values} is beyond int64")
        col.frombytes(np.arange(values.start, values.stop, dtype=np.int64).tobytes())
    else:
        col.fromlist(list(values))


def _fits(code: str, value: Any) -> bool:
    try:
        array(code, (value,))
    except (TypeError, OverflowError):
        return False
    return True


class NumericColumnTable:
    """A :class:`ColumnTable` whose values are all numbers (the step table): each column is an
    ``array.array`` of int64 until a float arrives, then of float64 -- the dtypes pandas infers
    for the same rows (ints alone: int64; ints with floats: float64, the ints converted).

    Values are converted as they are appended, while they are fresh in the CPU's cache; a
    ``ColumnTable`` keeps them as Python objects and reads each one back to type it when its chunk
    is compacted (0.32 s of a 9 s Mooncake replay at block 512: 176 ns a value, where the same
    code takes 76 ns on values just made). A value that is no
    int or float (None, a string), or an int beyond int64 while its column is int64, is refused
    with a ``ValueError`` naming its column, and the row or window leaves the table as it was; a
    float64 column takes an int as its nearest float. A bool is taken as the number it is (pandas
    would make the column object): give a numeric table no bools.

    A column is a list of arrays of ``NUMERIC_CHUNK_ROWS`` rows or so (every column cut at the same
    row), so an append never grows one large array: ``array`` over-allocates a sixteenth, so a
    growing column is copied whole again and again (fleets of 16 replicas grow 240 such columns at
    once, where ``realloc`` rarely extends in place); ``to_table`` joins the chunks, ints converted
    to floats in a column that turned float64 (the nearest double, as the conversion above)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._cols: list[array[Any]] = [array(_INT) for _ in columns]  # the open chunk of each column
        self._chunks: list[list[array[Any]]] = [[] for _ in columns]  # the full ones before it
        self._base = 0  # rows in the full chunks
        self._n = 0

    def append(self, *values: Any) -> None:
        """One row, in ``columns`` order."""
        if len(values) != len(self.columns):
            raise ValueError(f"a row of {len(values)} values for {len(self.columns)} columns")
        try:
            any(map(array.append, self._cols, values))  # one C loop, as ColumnTable.append
        except (TypeError, OverflowError):  # a float in an int64 column, or no number
            self._truncate(self._n)  # what the C loop appended before it stopped
            self.extend(*([v] for v in values))  # the row as a one-step window: extend's slow path
            return
        self._n += 1
        if self._n - self._base >= NUMERIC_CHUNK_ROWS:
            self._cut()

    def extend(self, *columns: Sequence[Any]) -> None:
        """Several rows given as columns (lists, or arrays of int64 or float64), in ``columns``
        order (a fast-forward window's steps)."""
        if len(columns) != len(self.columns):
            raise ValueError(f"{len(columns)} columns given for {len(self.columns)}")
        before = self._n
        saved = self._cols[:]  # a column turned float64 is a new array: a refusal restores this list
        try:
            try:
                # the columns C takes as they are (arrays of the column's type, lists of exact numbers,
                # ranges: compiled_window.put_columns, the same values as _put's), then the rest (_put)
                # in one C loop, as ColumnTable.extend; a refused column is left as it was (_put)
                done = _put_columns(self._cols, columns) if _put_columns is not None else 0
                any(map(_put, self._cols[done:], columns[done:]))
            except _REFUSED:
                self._truncate(before)
                for i, values in enumerate(columns):
                    self._add(i, list(values))
            lengths = [len(col) + self._base - before for col in self._cols]
            if lengths and lengths.count(lengths[0]) != len(lengths):
                raise ValueError(f"columns of unequal length: {lengths}")
        except ValueError:
            self._cols = saved
            self._truncate(before)
            raise
        self._n += lengths[0] if lengths else 0
        if self._n - self._base >= NUMERIC_CHUNK_ROWS:
            self._cut()

    def _cut(self) -> None:
        """Changes state: the open chunks become full ones; new open chunks of the same types."""
        for chunks, col in zip(self._chunks, self._cols):
            chunks.append(col)
        self._cols = [array(col.typecode) for col in self._cols]
        self._base = self._n

    def _truncate(self, n: int) -> None:
        """Changes state: back to ``n`` rows (never fewer than the full chunks hold)."""
        for col in self._cols:
            del col[n - self._base:]

    def _add(self, i: int, values: list[Any]) -> None:
        """Append ``values`` to column ``i`` (holding ``len(self)`` rows): an int64 column given a
        float becomes float64 first; anything else that is no int64 or float64 number is refused."""
        col = self._cols[i]
        try:
            col.fromlist(values)
            return
        except (TypeError, OverflowError) as exc:
            code: str = col.typecode
            if code == _INT and isinstance(exc, TypeError):
                as_float = array(_FLOAT, col)
                try:
                    as_float.fromlist(values)
                    self._cols[i] = as_float
                    return
                except (TypeError, OverflowError):
                    code = _FLOAT
        bad = next((v for v in values if not _fits(code, v)), None)
        raise ValueError(f"column {self.columns[i]!r}: {bad!r} is not an int64 or float64 number")

    def __len__(self) -> int:
        return self._n

    def to_table(self) -> Table:
        if not self._n:  # as ColumnTable: no rows, no dtypes
            return Table({name: [] for name in self.columns})
        parts = zip(self.columns, self._chunks, self._cols)
        return Table({name: _joined([*chunks, col]) for name, chunks, col in parts})


def join_numeric(tables: Sequence[NumericColumnTable]) -> list[np.ndarray] | None:
    """Each column of ``tables`` (non-empty, the same columns) joined across them in one go: the
    rows of the first, then of the second, ... -- what ``np.concatenate`` of their ``to_table``
    columns gives, without those per-table copies first (a fleet's step table: one copy of its rows
    instead of two). None when a column's dtype differs between tables (int64 in one, float64 in
    another: the caller then joins their Tables as pandas would type them)."""
    joiners = numeric_joiners(tables)
    return None if joiners is None else [join() for join in joiners]


def numeric_joiners(tables: Sequence[NumericColumnTable]) -> list[Callable[[], np.ndarray]] | None:
    """:func:`join_numeric` deferred: for each column a call that joins it (the rows the tables hold
    now: later appends are not seen), so that a column nobody reads is never copied
    (``sim.replay.table.LazyTable``); None as :func:`join_numeric`. Checks only the dtypes now."""
    out: list[Callable[[], np.ndarray]] = []
    opens = [t._n - t._base for t in tables]  # the open chunks' rows now (the same for every column)
    for i in range(len(tables[0].columns)):
        parts = [[*t._chunks[i], t._cols[i]] for t in tables]
        if len({p[-1].typecode for p in parts}) != 1:
            return None
        out.append(partial(_joined_at, parts, opens))
    return out


def _joined_at(parts: list[list[array[Any]]], opens: list[int]) -> np.ndarray:
    """:func:`_joined` of the tables' chunks, each table's open (last) chunk cut to ``opens`` rows."""
    chunks = []
    for p, m in zip(parts, opens, strict=True):
        chunks += p[:-1]
        chunks.append(p[-1] if len(p[-1]) == m else p[-1][:m])
    return _joined(chunks)


def _joined(chunks: list[array[Any]]) -> np.ndarray:
    """One column from its chunks: float64 if its last chunk is (the column turned float64 on the
    way: ints before that become their nearest doubles), else int64."""
    if len(chunks) == 1:
        return np.array(chunks[0])
    dtype = np.float64 if chunks[-1].typecode == _FLOAT else np.int64
    return np.concatenate([np.frombuffer(c, dtype=np.int64 if c.typecode == _INT else np.float64) for c in chunks
                           if len(c)]).astype(dtype, copy=False)
