"""apcsim plot: every figure is written (PNG and SVG, non-trivial) for a small sweep."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml

from sim.analysis.figure_style import discard
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
                 "engine": {"max_model_len": 512, "max_num_batched_tokens": 512}, "workload": _workload(30, 200),
                 "replay": {"attribution": "summary"}},  # the miss-cause figures need it
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
        if stem.startswith(("cluster_", "cpu_tier_")):  # cluster / CPU tier sweeps only (tests/test_cluster_tools.py,
            # tests/test_tier_sweep.py)
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
    # no block size / capacity axes: only the CDF, the salt-vs-tenants figure and the causes per salt apply
    assert sorted(Path(x).name for x in out) == ["miss_causes_vs_salt_policy.png", "miss_causes_vs_salt_policy.svg",
                                                 "salt_policy.png", "salt_policy.svg", "ttft_cdf.png", "ttft_cdf.svg"]
    assert main(["plot", str(tmp_path / "nope")]) == 2


def _panels(fig):
    return [ax for ax in fig.axes if ax.get_lines() or ax.patches]


def test_hit_rate_axes_fit_the_data_and_show_both_references(headline_like):
    from sim.analysis.plots import hit_rate_vs_block_size, hit_rate_vs_capacity

    d = SweepData(headline_like.folder)
    for build in (hit_rate_vs_block_size, hit_rate_vs_capacity):
        fig = build(d)
        for ax in _panels(fig):
            styles = {ln.get_linestyle() for ln in ax.get_lines()}
            assert {"-", "--", ":"} <= styles, (build.__name__, styles)  # engine, infinite cache, Belady
            lo, hi = ax.get_ylim()
            ys = [y for ln in ax.get_lines() for y in ln.get_ydata()]
            assert lo <= min(ys) and max(ys) <= hi  # every curve and reference visible
            assert hi - lo < 0.9  # fitted to the data, not 0..1
        labels = {ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()}
        assert labels == {"First-admission token hit rate\n(hit tokens / prompt tokens)"}
        fig.canvas.draw()  # the legend lies outside (right of) every panel
        assert len(fig.legends) == 1
        assert fig.legends[0].get_window_extent().x0 >= max(ax.get_window_extent().x1 for ax in fig.axes)
        discard(fig)


def test_hit_rate_curves_are_the_first_admission_rate(headline_like):
    from sim.analysis.plots import hit_rate_vs_block_size

    d = SweepData(headline_like.folder)
    fig = hit_rate_vs_block_size(d)
    solid = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    drawn = sorted(round(float(y), 12) for ln in solid for y in ln.get_ydata())
    assert drawn == sorted(round(float(y), 12) for y in d.df["first_admission_token_hit_rate"])
    discard(fig)


def test_log_axis_limits_enclose_the_data_between_labels():
    import matplotlib.pyplot as plt

    from sim.analysis.figure_style import time_axis

    fig, ax = plt.subplots()
    vals = [2.5, 3.1, 40.0]
    ax.plot([0, 1, 2], vals)
    assert time_axis(ax, "y", vals)
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.yaxis.get_majorticklocs() if lo * 0.999 <= t <= hi * 1.001]
    assert lo <= 2.5 and hi >= 40.0
    assert min(ticks) <= 2.5 and max(ticks) >= 40.0  # a label below the lowest and above the highest point
    assert (lo, hi) == (2.0, 50.0)
    discard(fig)


def test_ttft_cdf_per_salt_policy_and_per_any_column(headline_like):
    from sim.analysis.ttft_figures import ttft_cdf, ttft_cdf_by

    d = SweepData(headline_like.folder)
    fig = ttft_cdf(d)
    panels = _panels(fig)
    assert len(panels) == len(d.configs) * 2  # one column per salt policy
    assert {ax.get_title().splitlines()[1] for ax in panels} == {"salt policy: none", "salt policy: per_tenant"}
    assert all(len(ax.get_lines()) == 2 for ax in panels)  # one line per pool capacity
    discard(fig)
    fig = ttft_cdf_by(d, "block_size", lines="salt_policy")  # e.g. a router column, once clusters exist
    assert len(_panels(fig)) == len(d.configs) * 2 and "TTFT distribution per block size" in fig.texts[0].get_text()
    discard(fig)


def test_colours_are_colour_blind_safe_and_lines_distinct():
    from sim.analysis.figure_style import OKABE_ITO, colors, line_marks

    assert colors(6) == list(OKABE_ITO[:6])
    marks = line_marks(6)
    assert len({m["marker"] for m in marks}) == 6
    assert [m["ms"] for m in marks] == sorted((m["ms"] for m in marks), reverse=True)


def test_pivot_never_averages_a_hidden_axis(headline_like):
    d = SweepData(headline_like.folder)
    with pytest.raises(ValueError, match=r"hold .*kv_pool_gib.* fixed first"):
        d.pivot("first_admission_token_hit_rate", "_config", "block_size", d.where(salt_policy="none"))
    view = d.where(salt_policy="none", kv_pool_gib=0.25)
    table = d.pivot("first_admission_token_hit_rate", "_config", "block_size", view)
    assert list(table.index) == ["short", "long"] and list(table.columns) == [16, 64]  # order of appearance
    row = view[(view["_config"] == "long") & (view["block_size"] == 64)]
    assert table.loc["long", 64] == row["first_admission_token_hit_rate"].item()
