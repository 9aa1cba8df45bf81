"""``apcsim explain``: a salted run names the isolating salt; an evicted block names when, by whom
it was cached and for whose allocation it was evicted; missing recordings are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_attribution import P, replay, req

from sim.analysis.explain import ExplainError, explain, render
from sim.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_explain_names_the_isolating_salt(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "configs/my_trace.yaml"), "--set", "replay.attribution=full", "--out", str(out),
                 "--no-progress", "--no-bounds"]) == 0
    capsys.readouterr()
    assert main(["explain", str(out), "--request", "carol-1", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["namespace"] == {"salt": "tenant-b"}
    assert e["miss_tokens"] == {"partial_block": 4, "isolation": 64, "cold": 16}
    assert [b["cause"] for b in e["blocks"]] == ["isolation_salt"] * 4 + ["cold", "partial_block"]
    assert e["blocks"][0]["other_namespace"] == "no salt, no LoRA" and e["blocks"][0]["other_request"] == "alice-1"
    assert e["blocks"][-1]["tokens_short"] == 12
    assert main(["explain", str(out), "--request", "carol-1"]) == 0
    text = capsys.readouterr().out
    assert "salt 'tenant-b': the cache salt differs" in text and "12 tokens short" in text
    assert main(["explain", str(out), "--request", "carol-2"]) == 0
    assert "hit" in capsys.readouterr().out


def test_explain_an_eviction(tmp_path):
    r, _, blocks = replay([req("a", 0, P[:9]), req("c", 1, list(range(500, 513))), req("b", 2, P[:9])], num_blocks=5)
    r.reset_index().to_parquet(tmp_path / "requests.parquet")
    blocks.to_parquet(tmp_path / "blocks.parquet")
    e = explain(tmp_path, "b")
    ev = [b for b in e["blocks"] if b["cause"] == "evicted"]
    assert len(ev) == 2 and all(b["cached_by"] == "a" and b["evicted_for"] == "c" for b in ev)
    assert "for c's allocation" in render(e) and "cached at step" in render(e)


def test_explain_needs_the_full_level(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "configs/my_trace.yaml"), "--out", str(out), "--no-progress", "--no-bounds"]) == 0
    assert main(["explain", str(out), "--request", "carol-1"]) == 2
    assert "replay.attribution=full" in capsys.readouterr().err
    with pytest.raises(ExplainError, match="no requests"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "blocks.parquet").write_bytes(b"")
        explain(tmp_path / "empty", "x")


def test_miss_cause_figures_stack_to_one(tmp_path):
    from sim.analysis.miss_figures import fractions
    from sim.analysis.plots import plot_sweep
    from sim.analysis.sweep_data import SweepData

    assert main(["sweep", str(ROOT / "configs/sweeps/smoke.yaml"), "--set", "replay.attribution=summary",
                 "--set", "workload.sessions=6", "--output-dir", str(tmp_path), "--workers", "1",
                 "--no-progress", "--no-plots"]) == 0
    d = SweepData(tmp_path / "smoke")
    total = sum(fractions(d.df).values())
    assert abs(total - 1).max() < 1e-9  # hit + every cause = all prompt tokens, on every point
    stems = {p.stem for p in plot_sweep(tmp_path / "smoke")}
    assert {"miss_causes_vs_block_size", "miss_causes_vs_capacity", "miss_causes_vs_salt_policy"} <= stems
