"""Sweep files: grid / zip expansion, labelled axes, point keys, errors naming the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.experiment.config import ConfigError
from sim.experiment.sweep_config import load_sweep

BASE = {
    "latency": {"kind": "fixed", "step_time_s": 0.01},
    "engine": {"max_model_len": 512, "num_gpu_blocks": 200},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 10, "prefix_tokens": 64, "suffix_tokens": 16},
}


def _write(tmp_path: Path, data: dict, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_grid_times_zip(tmp_path):
    p = _write(tmp_path, {
        "name": "s", "base": BASE,
        "grid": {"engine.block_size": [16, 32, 64], "workload.zipf": [0.0, 1.0]},
        "zip": {"seed": [1, 2], "workload.rate": [5.0, 50.0]},
    })
    sw = load_sweep(p)
    assert len(sw.points) == 3 * 2 * 2
    assert sw.axis_keys == ["engine.block_size", "workload.zipf", "seed", "workload.rate"]
    first, last = sw.points[0], sw.points[-1]
    assert first.axes == {"engine.block_size": 16, "workload.zipf": 0.0, "seed": 1, "workload.rate": 5.0}
    assert last.axes == {"engine.block_size": 64, "workload.zipf": 1.0, "seed": 2, "workload.rate": 50.0}
    assert (last.config.engine.block_size, last.config.seed, last.config.workload.rate) == (64, 2, 50.0)
    # zipped values move together
    assert {(pt.config.seed, pt.config.workload.rate) for pt in sw.points} == {(1, 5.0), (2, 50.0)}
    # keys: distinct per config, stable across loads, independent of the sweep name
    keys = [pt.key for pt in sw.points]
    assert len(set(keys)) == len(keys)
    assert [pt.key for pt in load_sweep(p).points] == keys
    p2 = _write(tmp_path, {**yaml.safe_load(p.read_text()), "name": "other"}, "other.yaml")
    assert [pt.key for pt in load_sweep(p2).points] == keys
    assert [pt.index for pt in sw.points] == list(range(12))


def test_labelled_axis_and_child_override(tmp_path):
    p = _write(tmp_path, {
        "name": "s", "base": BASE,
        "grid": {
            "workload": {"small": {"kind": "synthetic_shared_prefix", "num_requests": 5},
                         "big": {"kind": "synthetic_shared_prefix", "num_requests": 50}},
            "workload.tenants.salt": ["none", "per_request"],
        },
    })
    sw = load_sweep(p)
    assert [pt.axes["workload"] for pt in sw.points] == ["small", "small", "big", "big"]
    # the child key is applied after the whole-workload value
    assert sw.points[1].config.workload.tenants.salt == "per_request"
    assert sw.points[2].config.workload.num_requests == 50


def test_base_config_file_and_inline_merge(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "base.yaml").write_text(yaml.safe_dump({"name": "x", **BASE}))
    p = _write(tmp_path, {"name": "s", "base_config": "exp/base.yaml", "base": {"engine": {"block_size": 32}},
                          "grid": {"seed": [0, 1]}})
    sw = load_sweep(p)
    cfg = sw.points[0].config
    assert cfg.engine.block_size == 32 and cfg.engine.num_gpu_blocks == 200  # merged, not replaced
    assert Path(cfg.base_dir) == exp  # input paths resolve against the base config's folder
    assert sw.folder() == Path("results/sweeps/s")


def test_no_axes_is_one_point(tmp_path):
    sw = load_sweep(_write(tmp_path, {"name": "s", "base": BASE}))
    assert len(sw.points) == 1 and sw.points[0].axes == {}


@pytest.mark.parametrize(
    "sweep, expected",
    [
        ({"grid": {"engine.blok_size": [16]}}, "grid.engine.blok_size: unknown key"),
        ({"grid": {"engine.block_size": [16, -1]}}, "grid.engine.block_size: Input should be greater than 0"),
        ({"zip": {"seed": [1, 2], "engine.block_size": [16]}},
         "zip.engine.block_size: has 1 values but zip.seed has 2"),
        ({"grid": {"engine.block_size": []}}, "grid.engine.block_size: needs at least one value"),
        ({"grid": {"engine.block_size": 16}}, "grid.engine.block_size: expected a list of values"),
        ({"grid": {"seed": [1]}, "zip": {"seed": [2]}}, "zip.seed: swept twice"),
        ({"grid": {"engine..x": [1]}}, "grid: axis key 'engine..x' must be a dotted config key"),
        ({"grid": {"name": ["a"]}}, "grid.name: cannot be swept"),
        ({"grid": {"workload.kind.x": [1]}}, "grid.workload.kind.x: workload.kind is not a mapping"),
        ({"gird": {"seed": [1]}}, "gird: unknown key"),
        ({"base": {**BASE, "engine": {"blok_size": 16}}}, "base.engine.blok_size: unknown key"),
        ({"base": None, "base_config": "missing.yaml"}, "base_config: no such file"),
    ],
)
def test_errors_name_sweep_file_and_key(tmp_path, sweep, expected):
    data = {"name": "s", "base": BASE, **sweep}
    if data.get("base") is None:
        data.pop("base")
    p = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_sweep(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: "), msg
    assert expected in msg, msg


def test_error_in_base_config_names_that_file(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"name": "x", **BASE, "engine": {"blok_size": 16}}))
    p = _write(tmp_path, {"name": "s", "base_config": "base.yaml", "grid": {"seed": [0]}})
    with pytest.raises(ConfigError, match=r"base\.yaml: engine\.blok_size: unknown key"):
        load_sweep(p)


def test_error_names_the_point(tmp_path):
    p = _write(tmp_path, {"name": "s", "base": BASE, "grid": {"seed": [0, 1], "engine.block_size": [16, 0]}})
    with pytest.raises(ConfigError, match=r"grid\.engine\.block_size: .*\(point seed=0, engine\.block_size=0\)"):
        load_sweep(p)


def test_shipped_sweeps_validate():
    root = Path(__file__).resolve().parents[1] / "configs" / "sweeps"
    files = sorted(root.glob("*.yaml"))
    assert {"smoke.yaml", "headline.yaml"} <= {f.name for f in files}
    for f in files:
        sw = load_sweep(f)
        assert sw.points, f
    head = load_sweep(root / "headline.yaml")
    assert len(head.points) == 3 * 6 * 4 * 3
    assert sorted({pt.config.engine.block_size for pt in head.points}) == [16, 32, 64, 128, 256, 512]
    assert {pt.config.workload.tenants.salt for pt in head.points} == {"none", "per_tenant", "per_request"}
    assert {pt.config.workload.kind for pt in head.points} == {"chat", "rag", "agent"}


def test_set_overrides_the_base(tmp_path):
    p = _write(tmp_path, {"name": "s", "base": BASE, "grid": {"engine.block_size": [16, 32]}})
    sw = load_sweep(p, overrides=["workload.num_requests=7", "engine.block_size=64"])
    assert {pt.config.workload.num_requests for pt in sw.points} == {7}
    assert [pt.config.engine.block_size for pt in sw.points] == [16, 32]  # the axis wins
    with pytest.raises(ConfigError, match=r"--set oops: an override must look like key.path=value"):
        load_sweep(p, overrides=["oops"])


def test_every_point_resolved_before_running_and_all_bad_points_reported(tmp_path):
    # Llama-3-8B's max_model_len 131,072 needs 16 GiB of KV cache: 2 and 4 GiB fail at both block sizes
    base = {"model": "llama-3-8b", "gpu": "H100-SXM", "latency": {"kind": "roofline"},
            "workload": {"kind": "chat", "sessions": 2}}
    p = _write(tmp_path, {"name": "s", "base": base,
                          "grid": {"engine.kv_cache_gib": [2, 4, 64], "engine.block_size": [16, 64]}})
    with pytest.raises(ConfigError) as err:
        load_sweep(p)
    lines = str(err.value).splitlines()
    assert len(lines) == 5 and lines[-1] == f"{p}: 4 of 6 points are invalid; nothing ran"
    for line, (gib, bs) in zip(lines, [(2, 16), (2, 64), (4, 16), (4, 64)]):
        assert line.startswith(f"{p}: grid.engine.kv_cache_gib: a pool of "), line
        assert "cannot hold one max_model_len=131072 sequence" in line
        assert line.endswith(f"(point engine.kv_cache_gib={gib}, engine.block_size={bs})"), line
    p2 = _write(tmp_path, {"name": "s", "base": {**base, "engine": {"max_model_len": 8192}},
                           "grid": {"engine.kv_cache_gib": [2, 4, 64], "engine.block_size": [16, 64]}}, "ok.yaml")
    assert len(load_sweep(p2).points) == 6


def test_one_problem_shared_by_every_point_is_listed_once(tmp_path):
    p = _write(tmp_path, {"name": "s", "base": {**BASE, "engine": {"blok_size": 16}},
                          "grid": {"seed": [0, 1, 2]}})
    with pytest.raises(ConfigError) as err:
        load_sweep(p)
    assert str(err.value).splitlines() == [f"{p}: base.engine.blok_size: unknown key",
                                           f"{p}: 3 of 3 points are invalid; nothing ran"]
