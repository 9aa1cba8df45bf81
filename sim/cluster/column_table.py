"""A compact append-only table: one typed array per column (mirrors nothing in vLLM).

A drop-in for ``sim.replay.metrics.RecordTable`` where rows are many and numeric -- a fleet's step
tables: 16 replicas record about 28 times the steps of one engine, and a row of Python objects
costs ~0.6 KB where eight bytes per cell suffice. A column holds ``int64`` while every value is an
int, ``float64`` while every value is a number, and falls back to a Python list otherwise, so
``to_frame`` gives the dtypes ``pandas.DataFrame.from_records`` would give the same rows.

Invariants: rows keep their order; ``to_frame`` equals ``RecordTable.to_frame`` of the same rows.
Imports numpy and pandas only.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd


class ColumnTable:
    """Typed columns, appended row by row (see the module docstring)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._cols: list[Any] | None = None
        self._n = 0

    def _start(self, values: tuple[Any, ...]) -> list[Any]:
        cols: list[Any] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int | float):
                cols.append([])
            else:
                cols.append(array("q" if isinstance(v, int) else "d"))
        return cols

    def append(self, *values: Any) -> None:
        cols = self._cols
        if cols is None:
            cols = self._cols = self._start(values)
        for i, v in enumerate(values):
            col = cols[i]
            try:
                col.append(v)
            except TypeError:  # a float in an int column, or a non-number: widen
                wide: Any = (array("d", col) if isinstance(col, array) and col.typecode == "q"
                             and isinstance(v, float) else list(col))
                wide.append(v)
                cols[i] = wide
        self._n += 1

    def extend(self, *columns: Iterable[Any]) -> None:
        """Several rows given as columns (``RecordTable.extend``): each appended in order."""
        for row in zip(*columns, strict=True):
            self.append(*row)

    def __len__(self) -> int:
        return self._n

    def to_frame(self) -> pd.DataFrame:
        if self._cols is None:
            return pd.DataFrame.from_records([], columns=list(self.columns))
        data: dict[str, Any] = {}
        for name, col in zip(self.columns, self._cols):
            if isinstance(col, array):
                data[name] = np.frombuffer(col, dtype=np.int64 if col.typecode == "q" else np.float64).copy()
            else:
                data[name] = pd.Series(col).infer_objects() if col else pd.Series(col, dtype=object)
        return pd.DataFrame(data, columns=list(self.columns))
