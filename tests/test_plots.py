"""apcsim plot: every figure is written (PNG and SVG, non-trivial) for a small sweep."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml

from sim.analysis.plots import FIGURES, SweepData, plot_sweep
from sim.cli.main import main
from sim.experiment.sweep import run_sweep


def _workload(n: int, prefix: int) -> dict:
    return {"kind": "synthetic_shared_prefix", "num_requests": n, "num_prefixes": 3, "prefix_tokens": prefix,
            "suffix_tokens": 48, "output_tokens": 8, "rate": 50.0, "tenants": {"num_tenants": 2}}


def _sweep(tmp_path: Path, grid: dict) -> Path:
    p = tmp_path / "plots.yaml"
    p.write_text(yaml.safe_dump({
        "name": "plots", "output_dir": str(tmp_path / "out"),
        "base": {"latency": {"kind": "fixed", "step_time_s": 0.005}, "model": "llama-3.2-1b",
                 "engine": {"max_model_len": 512, "max_num_batched_tokens": 512}, "workload": _workload(30, 200)},
        "grid": grid,
    }, sort_keys=False))
    return p


@pytest.fixture(scope="module")
def headline_like(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plots")
    p = _sweep(tmp, {"workload": {"short": _workload(30, 100), "long": _workload(30, 300)},
                     "engine.block_size": [16, 64], "engine.kv_cache_gib": [0.03, 0.25],
                     "workload.tenants.salt": ["none", "per_tenant"]})
    rep = run_sweep(p, workers=2, progress=False)
    plot_sweep(rep.folder)  # what `apcsim sweep` draws once the table is written (sim.cli.sweep)
    return rep


def test_every_figure_written(headline_like):
    rep = headline_like
    assert not rep.errors and len(rep.table) == 16
    names = {p.name for p in rep.folder.iterdir()}
    for stem in FIGURES:
        if stem.startswith("cluster_"):  # cluster sweeps only (tests/test_cluster_tools.py)
            assert f"{stem}.png" not in names
            continue
        for ext in ("png", "svg"):
            assert f"{stem}.{ext}" in names
            f = rep.folder / f"{stem}.{ext}"
            assert f.stat().st_size > 10_000, f
        img = mpimg.imread(rep.folder / f"{stem}.png")
        assert img.shape[0] > 400 and img.shape[1] > 600


def test_roles_and_config_labels(headline_like):
    d = SweepData(headline_like.folder)
    assert d.block and d.cap == "kv_pool_gib" and d.salt == "salt_policy" and d.tenants is None
    assert d.configs == ["short", "long"]
    assert d.caps() == [0.03, 0.25] and d.blocks() == [16, 64]


def test_plot_command_and_tenant_sweep(tmp_path, capsys):
    p = _sweep(tmp_path, {"workload.tenants.num_tenants": [1, 2, 4], "workload.tenants.salt": ["none", "per_tenant"]})
    rep = run_sweep(p, workers=1, progress=False)
    assert main(["plot", str(rep.folder)]) == 0
    out = capsys.readouterr().out.split()
    # no block size / capacity axes: only the CDF and the salt-vs-tenants figure apply
    assert sorted(Path(x).name for x in out) == ["salt_policy.png", "salt_policy.svg", "ttft_cdf.png", "ttft_cdf.svg"]
    assert main(["plot", str(tmp_path / "nope")]) == 2
