"""LazyTable (``sim.replay.table``): a Table whose columns are made on first read is the Table of
the same columns -- frame, Arrow table, ``numeric``, ``with_columns`` -- each column made once and
only when read; ``numeric_joiners`` (``sim.replay.column_table``) joins the rows its tables held
when it was called; and a fleet that only summarises joins only the step columns the summaries read."""

from __future__ import annotations

import numpy as np
import pytest
from pandas.testing import assert_frame_equal

import sim.replay.column_table as column_table
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from sim.replay.column_table import NumericColumnTable, join_numeric, numeric_joiners
from sim.replay.table import Column, LazyTable, Table


def _counted(cols: dict[str, Column]) -> tuple[LazyTable, dict[str, int]]:
    calls = dict.fromkeys(cols, 0)

    def maker(name: str):
        def make() -> Column:
            calls[name] += 1
            return cols[name]
        return make

    return LazyTable(len(next(iter(cols.values()))), {name: maker(name) for name in cols}), calls


COLS = {"a": np.arange(5, dtype=np.int64), "b": np.linspace(0.0, 1.0, 5), "c": ["x", None, "y", "z", "x"]}


def test_a_lazy_table_is_the_table_of_its_columns() -> None:
    lazy, _ = _counted(COLS)
    plain = Table(COLS)
    assert lazy.columns == plain.columns and list(lazy) == list(plain) and len(lazy) == len(plain)
    assert ("b" in lazy) and ("d" not in lazy)
    assert lazy.numeric("a", "b") and not lazy.numeric("c")
    assert_frame_equal(lazy.to_frame(), plain.to_frame())
    assert lazy.to_arrow().equals(plain.to_arrow())
    extra = np.ones(5)
    assert_frame_equal(lazy.with_columns(d=extra, a=extra).to_frame(), plain.with_columns(d=extra, a=extra).to_frame())


def test_a_column_is_made_once_and_only_when_read() -> None:
    lazy, calls = _counted(COLS)
    wider = lazy.with_columns(d=np.zeros(5))
    assert calls == {"a": 0, "b": 0, "c": 0}
    assert wider["b"] is lazy["b"] is wider["b"]  # made in one, the same object in both
    assert calls == {"a": 0, "b": 1, "c": 0}
    lazy.to_frame()
    assert calls == {"a": 1, "b": 1, "c": 1}


def test_a_column_of_another_length_is_refused() -> None:
    lazy = LazyTable(3, {"a": lambda: np.arange(4)})
    with pytest.raises(ValueError, match="'a' has 4 values for 3 rows"):
        lazy["a"]
    with pytest.raises(ValueError, match="'b' has 2 values for 3 rows"):
        lazy.with_columns(b=np.arange(2))


def test_joiners_join_the_rows_held_when_they_were_made(monkeypatch) -> None:
    monkeypatch.setattr(column_table, "NUMERIC_CHUNK_ROWS", 3)
    tables = [NumericColumnTable(("i", "f")) for _ in range(2)]
    for k, t in enumerate(tables):
        t.extend(list(range(k, k + 4)), [0.5 * v for v in range(4)])
    want = join_numeric(tables)
    joiners = numeric_joiners(tables)
    assert want is not None and joiners is not None
    for t in tables:  # later rows, one turning a column float64: not in the joins made before
        t.extend([7, 8], [1, 2.5])
        t.extend([9.5], [3])
    for join, col in zip(joiners, want, strict=True):
        got = join()
        assert got.dtype == col.dtype
        np.testing.assert_array_equal(got, col)
    assert numeric_joiners(tables) is not None and join_numeric([tables[0], NumericColumnTable(("i", "f"))]) is None


def test_a_fleet_that_only_summarises_joins_the_step_columns_its_summaries_read(monkeypatch) -> None:
    joined: list[int] = []
    real = column_table._joined
    monkeypatch.setattr(column_table, "_joined", lambda chunks: joined.append(1) or real(chunks))
    cfg = config_from_dict({
        "name": "lazy_steps", "seed": 5, "model": "llama-3-8b", "gpu": "H100-SXM",
        "engine": {"block_size": 16, "num_gpu_blocks": 300, "max_model_len": 2048},
        "workload": {"kind": "synthetic_shared_prefix", "num_requests": 40, "num_prefixes": 3,
                     "prefix_tokens": 256, "suffix_tokens": 40, "output_tokens": 30, "rate": 30.0},
        "cluster": {"replicas": 4, "router": {"kind": "round_robin"}},
    })
    result, _ = replay_experiment(cfg, progress=False)
    steps = result.step_table
    assert isinstance(steps, LazyTable)
    assert len(joined) == 2  # batch_size (num_steps, mean_batch_size) and duration (busy_s)
    assert len(steps) == result.summary["num_steps"] == sum(len(r.step_table) for r in result.replicas)
    assert steps.to_frame()["batch_size"].mean() == result.summary["mean_batch_size"]
