"""The step-cost probe: every variant timed, every figure of probe.md computed from probe.json's raw times."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from gpu_backend.calibration.step_cost_probe import layouts, main


def test_layouts_are_valid_block_tables_of_one_length() -> None:
    lay = layouts(np.random.default_rng(0))
    assert {"stride 1", "stride 2", "random"} <= set(lay)
    assert len({len(v) for v in lay.values()}) == 1
    for v in lay.values():
        assert 0 not in v and max(v) < 240 and len(set(v)) == len(v)
    assert lay["stride 1"] == list(range(1, 1 + len(lay["stride 1"])))


def test_probe_writes_raw_times_and_their_summary(tmp_path) -> None:
    assert main(["--out", str(tmp_path), "--rounds", "2"]) == 0
    rep = json.loads((tmp_path / "probe.json").read_text())
    md = (tmp_path / "probe.md").read_text()
    for name in ("layout", "history"):
        raw, rows = rep[name]["raw_s"], rep[name]["summary"]
        assert [r["variant"] for r in rows] == list(raw) and all(len(v) == 2 for v in raw.values())
        for r in rows:
            assert r["median_ms"] == pytest.approx(1e3 * float(np.median(raw[r["variant"]])))
            assert f"| {r['variant']} | 2 | {r['median_ms']:.3f} ms |" in md
        assert rows[0]["vs_first"] == 1.0
    assert rep["git_commit"] and rep["versions"] and rep["timing"] == "thread_cpu"
