"""A compact append-only table: one typed array per column (mirrors nothing in vLLM).

The step table of a replay: one row per engine step, all numbers, and many rows -- a fast-forward
window appends its steps as columns at once, and a fleet of 16 replicas records about 28 times the
steps of one engine. A row of Python objects costs ~0.6 KB where eight bytes per cell suffice, so
a column holds an ``array('q')`` while every value is an ``int``, an ``array('d')`` while every
value is an ``int`` or ``float``, and falls back to a Python list otherwise (a ``bool``, a string,
None). :meth:`ColumnTable.to_table` gives the :class:`~sim.replay.table.Table` of the same rows,
and so the dtypes ``pandas.DataFrame.from_records`` would give them.

Invariants: rows keep their order; every column has ``len(table)`` values; ``to_table`` equals
``Table.from_rows`` of the same rows (a property test); an int beyond int64 is refused (a float
array would keep it as a float, where pandas makes such a column an object one), and a refused
row or window leaves the table as it was. Imports numpy only.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np

from sim.replay.table import Column, Table, typed_column

_Store = array | list[Any]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _start(v: Any) -> _Store:
    """The store for a column whose first value is ``v``."""
    t = type(v)
    if t is int:
        return array("q")
    if t is float:
        return array("d")
    return []


def _check_ints(name: str, values: list[Any], types: set[type]) -> None:
    if int in types:
        for v in values:
            if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX:
                raise ValueError(f"column {name!r}: {v} is beyond int64")


def _widen(col: _Store, values: list[Any]) -> _Store:
    """``col`` made able to hold ``values`` too: int to float when they are numbers, else a list."""
    if isinstance(col, array) and col.typecode == "q" and set(map(type, values)) <= {int, float}:
        return array("d", col)
    return list(col)


class ColumnTable:
    """Typed columns, appended row by row or window by window (see the module docstring)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._cols: list[_Store] | None = None
        self._n = 0

    def append(self, *values: Any) -> None:
        """One row, in ``columns`` order."""
        if len(values) != len(self.columns):
            raise ValueError(f"a row of {len(values)} values for {len(self.columns)} columns")
        cols = self._cols
        if cols is None:
            cols = self._cols = [_start(v) for v in values]
        for i, v in enumerate(values):
            col = cols[i]
            if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX:
                for done in cols[:i]:  # leave the table as it was
                    done.pop()
                raise ValueError(f"column {self.columns[i]!r}: {v} is beyond int64")
            if type(v) is bool and isinstance(col, array):
                col = cols[i] = list(col)  # an array would store it as a number: pandas makes it an object
            try:
                col.append(v)
            except TypeError:  # a float in an int column, or a non-number: widen
                col = cols[i] = _widen(col, [v])
                col.append(v)
        self._n += 1

    def extend(self, *columns: Iterable[Any]) -> None:
        """Several rows given as columns, in ``columns`` order (a fast-forward window's steps)."""
        if len(columns) != len(self.columns):
            raise ValueError(f"{len(columns)} columns given for {len(self.columns)}")
        values = [v if isinstance(v, list) else list(v) for v in columns]
        n = len(values[0])
        if any(len(v) != n for v in values):
            raise ValueError(f"columns of unequal length: {[len(v) for v in values]}")
        if not n:
            return
        types = [set(map(type, vals)) for vals in values]
        for name, vals, ts in zip(self.columns, values, types, strict=True):
            _check_ints(name, vals, ts)  # before any change: a refused window leaves the table as it was
        cols = self._cols
        if cols is None:
            cols = self._cols = [_start(v[0]) for v in values]
        for i, vals in enumerate(values):
            col = cols[i]
            if isinstance(col, array):
                before = len(col)
                try:
                    if bool in types[i]:
                        raise TypeError("a bool: an array would store it as a number, pandas as an object")
                    col.extend(vals)
                    continue
                except TypeError:  # undo the part appended, then widen
                    del col[before:]
                    col = cols[i] = _widen(col, vals)
            col.extend(vals)
        self._n += n

    def __len__(self) -> int:
        return self._n

    def to_table(self) -> Table:
        if self._cols is None:
            return Table({name: [] for name in self.columns})
        out: dict[str, Column] = {}
        for name, col in zip(self.columns, self._cols, strict=True):
            if isinstance(col, array):
                out[name] = np.frombuffer(col, dtype=np.int64 if col.typecode == "q" else np.float64).copy()
            else:
                out[name] = typed_column(col)
        return Table(out)
