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

Invariants: rows keep their order; every column has ``len(table)`` values; ``to_table`` equals
``Table.from_rows`` of the same rows (a property test, chunk boundaries included); a refused row or
window (wrong width, unequal columns) leaves the table as it was. Imports numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any

import numpy as np

from sim.replay.table import Column, Table, typed_column

CHUNK_ROWS = 8192  # rows of Python values a column holds before they become one numpy chunk


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
