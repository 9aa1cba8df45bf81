"""A replay's table as typed columns, turned into pandas or Arrow only on request (mirrors nothing
in vLLM: the simulator's own output).

A replay records one row per request and one per step (``sim.replay.recorder``). A run that only
summarises and writes its results needs neither a DataFrame nor pandas, whose import alone costs
about half a second -- as much as a small replay. A :class:`Table` is the hand-over form: an
ordered mapping of column names to columns, each column either

* a numpy array, when its values are all ``int`` (``int64``), all ``bool``, or numbers (``int`` /
  ``float``, ``None`` read as NaN: ``float64``) -- the dtype ``pandas.DataFrame.from_records``
  infers for the same values; or
* the Python list of its values otherwise (strings, ``None`` only, mixed types), which pandas
  infers when a DataFrame is made.

So ``Table.to_frame()`` equals ``DataFrame.from_records`` of the same rows, dtypes included (a
property test), and ``to_arrow()`` is the Arrow table that pandas' ``to_parquet`` writes for that
frame: NaN written as null, as ``pyarrow.Table.from_pandas`` does.

:class:`LazyTable` is a Table whose columns are made on first read: a fleet's step table (16
replicas, 613,645 rows x 16 columns on the first 2,000 Mooncake requests: 75 MiB) is read only for
two columns by the summary, and joined whole only when something writes it.

Invariants: every column has ``len(table)`` values; columns keep their order; a Table is not
changed after it is made (``with_columns`` returns a new one; a lazy column, once made, is kept
and never made again). Imports numpy only;
pandas and pyarrow are imported by the methods that return their objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

Column = np.ndarray | list[Any]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_NUMBER_TYPES = frozenset({int, float})
_OPTIONAL_NUMBER_TYPES = frozenset({int, float, type(None)})


def typed_column(values: Sequence[Any]) -> Column:
    """``values`` as an ``int64`` / ``float64`` / ``bool`` array where pandas would infer that
    dtype from them, else as a list (see the module docstring). Exact types only: a numpy scalar
    or an ``int`` subclass other than ``bool`` keeps the list form, which pandas then infers."""
    if not len(values):
        return list(values)
    types = set(map(type, values))
    try:
        if types == {int}:
            return np.array(values, dtype=np.int64)
        if types == {bool}:
            return np.array(values, dtype=np.bool_)
        if types <= _OPTIONAL_NUMBER_TYPES and types & _NUMBER_TYPES and (
                int not in types or all(INT64_MIN <= v <= INT64_MAX for v in values if type(v) is int)):
            # ints with floats or None: pandas makes them float64, None as NaN
            return np.array([np.nan if v is None else v for v in values] if type(None) in types else values,
                            dtype=np.float64)
    except OverflowError:  # an int beyond int64: pandas decides (uint64 or object)
        pass
    return list(values)


def is_numeric(col: Column) -> bool:
    """True for an int, float or bool numpy column."""
    return isinstance(col, np.ndarray) and col.dtype.kind in "biuf"


class Table:
    """Named columns of equal length (see the module docstring)."""

    __slots__ = ("_cols", "_n")

    def __init__(self, columns: dict[str, Column]) -> None:
        lengths = {len(c) for c in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of unequal length: { {k: len(c) for k, c in columns.items()} }")
        self._cols = dict(columns)
        self._n = lengths.pop() if lengths else 0

    @classmethod
    def from_rows(cls, names: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
        """The table of ``rows`` (each in ``names`` order), each column typed by :func:`typed_column`."""
        cols = list(zip(*rows, strict=True))
        if not cols:
            return cls({name: [] for name in names})
        if len(cols) != len(names):
            raise ValueError(f"rows of {len(cols)} values for {len(names)} columns")
        return cls({name: typed_column(col) for name, col in zip(names, cols, strict=True)})

    # -- queries ------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    def __getitem__(self, name: str) -> Column:
        return self._cols[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def numeric(self, *names: str) -> bool:
        """True when every named column is a numeric array (see :func:`is_numeric`)."""
        return all(is_numeric(self._cols[n]) for n in names)

    # -- new tables ---------------------------------------------------------------------------
    def with_columns(self, **columns: Column) -> Table:
        """A new table with ``columns`` added after the others (or replacing same-named ones)."""
        return Table({**self._cols, **columns})

    # -- conversions --------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """The DataFrame ``from_records`` gives the same rows (list columns inferred by pandas;
        an empty table's columns are ``object``, as ``from_records`` makes them)."""
        import pandas as pd

        if not self._n:
            return pd.DataFrame.from_records([], columns=self.columns)
        return pd.DataFrame(self._cols, columns=self.columns)

    def to_arrow(self) -> pa.Table:
        """The Arrow table of :meth:`to_frame` as pandas writes it (NaN and None as null). Raises
        ``pyarrow.ArrowInvalid`` / ``ArrowTypeError`` for a list column Arrow cannot type alone
        (mixed types), and ImportError without pyarrow."""
        import pyarrow as pa

        return pa.Table.from_arrays([_arrow_column(col) for col in self._cols.values()], names=self.columns)

    def __repr__(self) -> str:
        return f"Table({self._n} rows: {', '.join(self.columns)})"


class LazyTable(Table):
    """A :class:`Table` of ``n`` rows whose columns are made by ``makers`` (name -> a call returning
    the column) on first read, each once (the same object at every later read); ``to_frame``,
    ``to_arrow`` and ``numeric`` make the columns they need. A made column of another length
    raises ValueError (a Table's columns all have ``len(table)`` values). Costs nothing per column
    until read: the caller keeps what a maker reads alive (a fleet's step columns in its recorders)."""

    __slots__ = ("_makers", "_names")

    def __init__(self, n: int, makers: dict[str, Callable[[], Column]]) -> None:
        super().__init__({})
        self._n = n
        self._makers = dict(makers)
        self._names = tuple(makers)

    @property
    def columns(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __getitem__(self, name: str) -> Column:
        col = self._cols.get(name)
        if col is None:
            col = self._makers[name]()
            if len(col) != self._n:
                raise ValueError(f"lazy column {name!r} has {len(col)} values for {self._n} rows")
            self._cols[name] = col
        return col

    def numeric(self, *names: str) -> bool:
        return all(is_numeric(self[n]) for n in names)

    def with_columns(self, **columns: Column) -> Table:
        """A new lazy table with ``columns`` added after the others (or replacing same-named ones);
        this one's columns stay lazy there (a column made in either is made once for both)."""
        for name, col in columns.items():
            if len(col) != self._n:
                raise ValueError(f"column {name!r} has {len(col)} values for {self._n} rows")
        return self.with_lazy_columns(**{name: _given(col) for name, col in columns.items()})

    def with_lazy_columns(self, **makers: Callable[[], Column]) -> LazyTable:
        """:meth:`with_columns` of columns made on first read, by ``makers``."""
        both = {name: makers[name] if name in makers else self._shared(name) for name in (*self._names, *makers)}
        return LazyTable(self._n, both)

    def _shared(self, name: str) -> Callable[[], Column]:
        return lambda: self[name]

    def to_frame(self) -> pd.DataFrame:
        return self._made().to_frame()

    def to_arrow(self) -> pa.Table:
        return self._made().to_arrow()

    def _made(self) -> Table:
        """The plain Table of every column (made now where not yet)."""
        return Table({name: self[name] for name in self._names})


def _given(col: Column) -> Callable[[], Column]:
    return lambda: col


def _bitmap(bits: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.py_buffer(np.packbits(bits, bitorder="little"))


def _arrow_column(col: Column) -> pa.Array:
    """One column as an Arrow array, built from its buffers where it can be: ``pyarrow.array``
    would import pandas (its pandas checks), which is what a Table saves. Numbers and bools,
    strings with None, and None alone are built so; any other list goes through
    ``pyarrow.array``."""
    import pyarrow as pa

    n = len(col)
    if isinstance(col, np.ndarray):
        if col.dtype == np.bool_:
            return pa.Array.from_buffers(pa.bool_(), n, [None, _bitmap(col)])
        if col.dtype.kind == "f":
            nan = np.isnan(col)
            valid = _bitmap(~nan) if nan.any() else None  # NaN is written as null, as pandas does
            x = np.ascontiguousarray(col, dtype=np.float64)
            return pa.Array.from_buffers(pa.float64(), n, [valid, pa.py_buffer(x)], null_count=int(nan.sum()))
        if col.dtype.kind in "iu":
            data = pa.py_buffer(np.ascontiguousarray(col))
            return pa.Array.from_buffers(pa.from_numpy_dtype(col.dtype), n, [None, data])
    types = set(map(type, col))
    if types == {type(None)}:
        return pa.nulls(n)
    if types <= {str, type(None)}:
        data = [v.encode() if v is not None else b"" for v in col]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        missing = np.fromiter((v is None for v in col), dtype=np.bool_, count=n)
        valid = _bitmap(~missing) if missing.any() else None
        return pa.Array.from_buffers(pa.large_string(), n, [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))],
                                     null_count=int(missing.sum()))
    return pa.array(col, from_pandas=True)
