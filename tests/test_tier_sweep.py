"""The CPU offload tier as a sweep axis: ``null``/``none`` is a point without a tier, a size x policy
grid runs its untiered config once, rows carry the tier's size, and the tier figures are drawn
(only) for a sweep over the tier's size. Tiny inputs: a tiered replay is slow."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml

from sim.analysis.figure_style import discard
from sim.analysis.plots import FIGURES, SweepData, plot_sweep
from sim.analysis.tier_figures import cpu_tier_hit_rate, cpu_tier_ttft, shares
from sim.experiment.config import ConfigError
from sim.experiment.sweep import SweepReport, run_sweep
from sim.experiment.sweep_config import load_sweep

# llama-3.2-1b: 32 KiB of KV per token, a 16-token chunk 512 KiB: 0.03 GiB = 61 chunks, 0.2 GiB = 409
BASE = {
    "seed": 0, "model": "llama-3.2-1b", "gpu": "H100-SXM",
    "latency": {"kind": "fixed", "step_time_s": 0.005},
    "engine": {"num_gpu_blocks": 64, "max_model_len": 1024, "max_num_batched_tokens": 1024},
    "workload": {"kind": "chat", "sessions": 6, "turns": {"dist": "fixed", "mean": 4},
                 "system_prompt_tokens": 64, "user_tokens": {"dist": "fixed", "mean": 48},
                 "output_tokens": {"dist": "fixed", "mean": 8},
                 "think_time": {"dist": "fixed", "mean": 0.5}, "max_context_tokens": 900,
                 "arrival": {"kind": "poisson", "rate": 20.0}},
}


def _sweep(tmp: Path, grid: dict, name: str = "tier", bounds: bool = True) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "output_dir": str(tmp / "out"), "base": BASE, "grid": grid,
                                 "bounds": bounds}, sort_keys=False))
    return p


@pytest.fixture(scope="module")
def tier_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepReport:
    tmp = tmp_path_factory.mktemp("tier")
    p = _sweep(tmp, {"engine.kv_offloading_size": ["none", 0.03, 0.2], "engine.kv_offloading_policy": ["lru", "arc"]})
    rep = run_sweep(p, workers=2, progress=False)
    plot_sweep(rep.folder)
    return rep


def test_no_tier_axis_value(tmp_path: Path) -> None:
    sw = load_sweep(_sweep(tmp_path, {"engine.kv_offloading_size": [None, 0.02], "engine.kv_offloading_policy":
                                      ["lru", "arc"]}))
    assert [p.axes["engine.kv_offloading_size"] for p in sw.points] == ["none", "none", 0.02, 0.02]
    none_lru, none_arc, lru, arc = sw.points
    assert none_lru.key == none_arc.key  # one untiered config, run once
    assert none_lru.config.engine.kv_offloading_policy is None and none_lru.config.engine.kv_offloading_size is None
    assert arc.config.engine.kv_offloading_policy == "arc" and lru.key != arc.key
    # "none" and null are the same value: not distinct
    with pytest.raises(ConfigError, match="values must be distinct"):
        load_sweep(_sweep(tmp_path, {"engine.kv_offloading_size": [None, "none", 0.02]}))
    # a policy axis with no tier at all is still refused, naming the axis
    with pytest.raises(ConfigError, match="grid.engine.kv_offloading_policy: .*needs a CPU offload tier"):
        load_sweep(_sweep(tmp_path, {"engine.kv_offloading_policy": ["lru", "arc"]}))
    # chunks as the axis, with a point without a tier
    sw = load_sweep(_sweep(tmp_path, {"engine.num_cpu_blocks": [None, 16]}))
    assert sw.points[0].config.engine.num_cpu_blocks is None and sw.points[1].config.engine.num_cpu_blocks == 16


def test_rows_carry_the_tier(tier_sweep: SweepReport) -> None:
    rep = tier_sweep
    assert not rep.errors and rep.ran == 5  # 6 points, the untiered one shared by both policies
    t = rep.table
    assert list(t["engine.kv_offloading_size"]) == ["none", "none", "0.03", "0.03", "0.2", "0.2"]
    untiered, tiered = t.iloc[:2], t.iloc[2:]
    assert untiered["num_cpu_chunks"].isna().all() and untiered["cpu_tier_gib"].isna().all()
    assert list(tiered["num_cpu_chunks"]) == [61, 61, 409, 409]
    assert list(tiered["cpu_tier_policy"]) == ["lru", "arc", "lru", "arc"]
    assert tiered["cpu_tier_gib"].tolist() == pytest.approx([61 / 2048, 61 / 2048, 409 / 2048, 409 / 2048])
    assert (tiered["cpu_tier.num_chunks"] == tiered["num_cpu_chunks"]).all()  # the tier summary agrees
    gpu, cpu = shares(t)
    assert (cpu[:2] == 0).all() and (cpu[4:] > 0).all()  # chat turns come back from the CPU tier
    assert (cpu[4:] >= cpu[2:4]).all()  # a larger tier holds more (61 chunks: LRU 0, ARC > 0 today)
    assert gpu[0] == pytest.approx(t["first_admission_token_hit_rate"].iloc[0])
    assert (gpu[2:] == t["hit_rate_by_source.gpu"].iloc[2:]).all()


def test_untiered_rows_unchanged(tmp_path: Path) -> None:
    rep = run_sweep(_sweep(tmp_path, {"engine.num_gpu_blocks": [64, 128]}, name="plain", bounds=False),
                    workers=1, progress=False)
    assert not rep.errors
    cols = set(rep.table.columns)
    assert not cols & {"num_cpu_chunks", "cpu_tier_gib", "cpu_tier_capacity_tokens", "cpu_tier_policy",
                       "hit_rate_by_source.cpu", "cpu_tier.num_chunks"}
    d = SweepData(rep.folder)
    assert cpu_tier_hit_rate(d) is None and cpu_tier_ttft(d) is None
    assert not any(p.name.startswith("cpu_tier_") for p in rep.folder.iterdir())


def test_tier_figures(tier_sweep: SweepReport) -> None:
    folder = tier_sweep.folder
    for stem in ("cpu_tier_hit_rate", "cpu_tier_ttft"):
        assert stem in FIGURES
        for ext in ("png", "svg"):
            assert (folder / f"{stem}.{ext}").stat().st_size > 10_000
        img = mpimg.imread(folder / f"{stem}.png")
        assert img.shape[0] > 300 and img.shape[1] > 600
    d = SweepData(folder)
    fig = cpu_tier_hit_rate(d)
    assert fig is not None
    panels = [ax for ax in fig.axes if ax.patches]
    assert [ax.get_title() for ax in panels] == ["policy=lru", "policy=arc"]
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["none", "0.03", "0.2"]
    refs = [line for line in panels[1].get_lines() if line.get_marker() == "_"]  # two-tier references (ARC)
    t = tier_sweep.table
    assert len(refs) == 1 and np.allclose(np.asarray(refs[0].get_ydata(), dtype=float), [
        t["lru_sequential_hit_rate"].iloc[1], *t["two_tier_arc_sequential_hit_rate"].iloc[[3, 5]]])
    discard(fig)


def test_chunk_axis_beside_block_size(tmp_path: Path) -> None:
    """A num_cpu_blocks axis: one x position per swept count whatever its GiB at each block size."""
    rep = run_sweep(_sweep(tmp_path, {"engine.num_cpu_blocks": [None, 32, 400], "engine.block_size": [16, 32]},
                           name="chunks", bounds=False), workers=2, progress=False)
    assert not rep.errors and list(rep.table["num_cpu_chunks"].fillna(0)) == [0, 0, 32, 32, 400, 400]
    d = SweepData(rep.folder)
    hit, ttft = cpu_tier_hit_rate(d), cpu_tier_ttft(d)
    assert hit is not None and ttft is not None
    panels = [ax for ax in hit.axes if ax.patches]
    assert [ax.get_title() for ax in panels] == ["block_size=16", "block_size=32"]
    assert [t.get_text() for t in panels[1].get_xticklabels()] == ["none", "32\n(0.0312 GiB)", "400\n(0.391 GiB)"]
    lines = [ax for ax in ttft.axes if ax.get_lines()]
    assert [t.get_text() for t in lines[0].get_xticklabels()] == ["none", "32", "400"]  # GiB differ by block size
    assert all(np.array_equal(np.asarray(line.get_xdata()), [0, 1, 2]) for line in lines[0].get_lines())
    discard(hit)
    discard(ttft)
