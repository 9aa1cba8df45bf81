"""The newcomer frictions of issue 36, each fixed and held here: ``apcsim explain`` groups a run of
blocks with one cause into one line (``--blocks all`` for each) and lists the requests that missed
most (``--top N``); the diagnosis and ``explain`` print one mapping between their vocabularies; a
cluster run's summary names its primary router and its routers table has p90, one unit style and
its SLO; the notebook has a light extra without torch or Ray."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pandas as pd

from sim.analysis.diagnosis import VOCABULARY
from sim.analysis.explain import render, render_top, top_requests
from sim.cli.summary import render as render_summary
from sim.cli.summary import render_routers

ROOT = Path(__file__).resolve().parents[1]


def _block(i: int, cause: str, hit: bool = False, **extra) -> dict:
    return {"block": i, "start": 16 * i, "end": 16 * i + 16, "group": 0, "hash": f"{i:012x}", "hit": hit,
            "cause": cause, **extra}


def _explained(blocks: list[dict]) -> dict:
    return {"request_id": "r", "prompt_tokens": 16 * len(blocks), "hit_tokens": 32, "missed_tokens": 0,
            "namespace": {}, "prompt_logprobs": False, "miss_tokens": {}, "miss_isolation_tokens": {},
            "blocks": blocks}


def test_explain_puts_a_run_of_blocks_with_one_cause_on_one_line() -> None:
    blocks = [_block(0, "hit", True), _block(1, "hit", True)] + [
        _block(i, "evicted", cached_by="a", cached_step=1, evicted_step=i, evict_reason="reused",
               evicted_for="b", evicted_block_id=i) for i in range(2, 40)] + [_block(40, "cold"), _block(41, "cold")]
    grouped = render(_explained(blocks)).splitlines()
    rows = [ln for ln in grouped if re.match(r"\s*\d", ln)]
    assert [r.split()[0] for r in rows] == ["0-1", "2-39", "40-41"]
    assert "2-39  32-640" in rows[1] and "38 blocks" in rows[1] and "--blocks all shows each" in rows[1]
    each = [ln for ln in render(_explained(blocks), all_blocks=True).splitlines() if re.match(r"\s*\d", ln)]
    assert len(each) == 42 and "evicted at step 39" in each[39]


def test_explain_top_lists_the_requests_that_missed_most_with_their_main_cause(tmp_path: Path) -> None:
    pd.DataFrame({
        "request_id": ["a", "b", "c", "d"], "prompt_tokens": [100, 400, 300, 900], "hit_tokens": [0, 100, 300, 0],
        "status": ["ok", "ok", "ok", "rejected"],
        **{f"miss_{c}_tokens": v for c, v in {"skip": [0, 0, 0, 0], "last_token": [0, 0, 0, 0],
                                              "partial_block": [4, 12, 0, 0], "eagle": [0, 0, 0, 0],
                                              "isolation": [0, 0, 0, 0], "in_flight": [0, 0, 0, 0],
                                              "evicted": [0, 288, 0, 0], "unreachable": [0, 0, 0, 0],
                                              "cold": [96, 0, 0, 0]}.items()},
    }).to_parquet(tmp_path / "requests.parquet")
    t = top_requests(tmp_path, 2)
    assert [(r["request_id"], r["missed_tokens"], r["main_cause"]) for r in t["requests"]] == [
        ("b", 300, "evicted"), ("a", 100, "cold")]
    assert t["num_requests"] == 3  # the rejected request was never looked up
    text = render_top(t)
    assert "b" in text and "evicted (288 tokens)" in text and VOCABULARY.split()[0] in text


def test_the_diagnosis_and_explain_print_the_same_vocabulary_mapping() -> None:
    for cause in ("capacity", "overload", "isolation", "block granularity", "never repeated",
                  "evicted", "in_flight", "cold", "partial_block"):
        assert cause in VOCABULARY
    explained = render(_explained([_block(0, "cold")]))
    assert " ".join(explained.split()[-20:]) in " ".join(VOCABULARY.split())
    s = {"num_requests": 10, "prompt_tokens": 1000, "first_admission_token_hit_rate": 0.2,
         "infinite_cache_hit_rate": 0.5, "lru_sequential_hit_rate": 0.25, "num_evictions": 5,
         "engine": {"num_gpu_blocks": 100, "block_size": 16, "capacity_tokens": 1600, "model": "m", "gpu": "g",
                    "max_model_len": 1024}}
    summary = render_summary(s, name="x", folder="out", wall_time_s=1.0)
    assert "capacity" in summary and " ".join(VOCABULARY.split()) in " ".join(summary.split())


def _cluster_summary() -> dict:
    row = {"ttft_p50_s": 0.394, "ttft_p90_s": 1.57, "ttft_p99_s": 6.36, "request_hit_rate": 0.137,
           "token_hit_rate": 0.137, "goodput_fraction": 0.928}
    return {"num_requests": 600, "first_admission_token_hit_rate": 0.137, "ttft_p50_s": 0.394,
            "cluster": {"num_replicas": 8, "router": {"kind": "sglang"}, "ttft_slo_s": 2.0,
                        "comparison": [{"router": "sglang", **row},
                                       {"router": "round_robin", **row, "ttft_p50_s": 0.371, "ttft_p90_s": 1.81}]}}


def test_a_cluster_summary_names_its_primary_router() -> None:
    text = render_summary(_cluster_summary(), name="q", folder="out", wall_time_s=1.0)
    assert "hit rate    (fractions of prompt tokens; the fleet under the sglang router)" in text
    assert re.search(r"^latency .*\(the fleet under the sglang router\)$", text, re.M)


def test_the_routers_table_has_p90_one_unit_style_and_names_its_slo() -> None:
    lines = render_routers(_cluster_summary())
    assert "goodput: TTFT <= 2.00 s" in lines[0]
    assert lines[1].split() == ["router", "hit", "rate", "TTFT", "p50", "TTFT", "p90", "TTFT", "p99", "goodput"]
    assert lines[2].split() == ["sglang", "0.137", "394", "ms", "1.57", "s", "6.36", "s", "92.8", "%"]
    assert lines[3].split()[:5] == ["round_robin", "0.137", "371", "ms", "1.81"]
    assert render_routers({"cluster": {"router": {"kind": "dynamo"}}}) == []


def test_the_notebook_extra_is_light_and_covers_what_the_notebook_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["notebook"]
    names = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower() for d in extra}
    assert "ipykernel" in names and not names & {"torch", "ray", "triton"}
    nb = json.loads((ROOT / "notebooks" / "sweep_analysis.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    imported = set(re.findall(r"^\s*(?:from|import)\s+(\w+)", code, re.M))
    default = {re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not imported & {"torch", "ray", "gpu_backend"}
    assert imported <= {"IPython", "json", "os", "pathlib", "sim", "workloads", *default}


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_a_linear_time_axis_starts_at_zero_and_panel_titles_never_overlap() -> None:
    from sim.analysis import figure_style as fs

    fig, axes = fs.grid(1, 3)
    for ax in axes[0]:
        ax.plot([16, 64, 256], [0.5000, 0.5004, 0.5008])
        assert fs.time_axis(ax, "y", [0.5000, 0.5004, 0.5008]) is False
        ax.set_title("TTFT p50 -- capacity 16 GiB (131,072 tokens), salt policy per_tenant, 4 tenants")
    fs.finish(fig, "sweep: time to first token vs block size", [])
    fig.canvas.draw()
    assert all(ax.get_ylim()[0] == 0.0 for ax in axes[0])  # a 0.8 ms spread is not magnified into a trend
    boxes = [ax.title.get_window_extent() for ax in axes[0]]
    assert not any(_overlap(boxes[i], boxes[j]) for i in range(3) for j in range(i + 1, 3))
    fs.discard(fig)


def test_the_sidechannel_tradeoff_legend_sits_below_the_panels() -> None:
    from sim.analysis import figure_style as fs
    from sim.analysis.sidechannel_data import SideChannelData
    from sim.analysis.sidechannel_figures import tradeoff

    fig = tradeoff(SideChannelData(ROOT / "results" / "sidechannel"))
    assert fig is not None
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    panels = [ax.get_window_extent() for ax in fig.axes]
    width = fig.get_window_extent().width
    assert legend.y1 <= min(p.y0 for p in panels)  # below, not beside: the panels keep the width
    assert sum(p.width for p in panels) > 0.6 * width
    fs.discard(fig)


def test_a_sweep_prints_its_axes_against_the_headline_metrics(tmp_path: Path) -> None:
    from sim.cli.sweep_table import render_sweep_table

    pd.DataFrame({
        "point": [1, 0, 2], "key": ["k1", "k0", "k2"], "status": ["ok", "ok", "error"],
        "engine.block_size": [64, 16, 256], "cluster.router": ["sglang", "sglang", "dynamo"],
        "first_admission_token_hit_rate": [0.5, 0.75, float("nan")], "ttft_p50_s": [0.0123, 1.5, float("nan")],
        "ttft_p90_s": [0.02, 2.0, float("nan")], "ttft_p99_s": [0.5, 3.25, float("nan")],
        "cluster.goodput_fraction": [0.928, 0.5, float("nan")], "cluster.ttft_slo_s": [2.0, 2.0, 2.0],
    }).to_parquet(tmp_path / "table.parquet")
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": [{"key": "engine.block_size"},
                                                              {"key": "cluster.router"}]}))
    lines = render_sweep_table(tmp_path).splitlines()
    assert lines[0] == "points      hit rate: first admission; goodput: TTFT <= 2.00 s"
    assert lines[1].split() == ["block_size", "router", "hit", "rate", "TTFT", "p50", "TTFT", "p90", "TTFT", "p99",
                                "goodput"]
    assert lines[2].split() == ["16", "sglang", "0.750", "1.50", "s", "2.00", "s", "3.25", "s", "50.0", "%"]
    assert lines[3].split() == ["64", "sglang", "0.500", "12.3", "ms", "20.0", "ms", "500", "ms", "92.8", "%"]
    assert lines[4].split()[:3] == ["256", "dynamo", "(error:"] and "points/k2/error.txt" in lines[4]
    assert render_sweep_table(tmp_path, max_rows=1).splitlines()[-1].startswith("  ... 2 more points")


def test_set_output_dir_and_name_move_a_sweep_or_study_folder(tmp_path: Path) -> None:
    from sim.experiment.sidechannel_study import load_study
    from sim.experiment.sweep_config import load_sweep

    sweep = load_sweep(ROOT / "configs" / "sweeps" / "smoke.yaml", None, [f"output_dir={tmp_path}", "name=mine"])
    assert Path(sweep.folder()) == tmp_path / "mine"
    study = load_study(ROOT / "configs" / "sidechannel.yaml", None, [f"output_dir={tmp_path}"])
    assert Path(study.folder()) == tmp_path / "sidechannel"
    flag = load_sweep(ROOT / "configs" / "sweeps" / "smoke.yaml", str(tmp_path / "flag"), [f"output_dir={tmp_path}"])
    assert Path(flag.folder()) == tmp_path / "flag" / "smoke"  # --output-dir, when given, wins


def test_committed_reference_results_are_not_overwritten_without_force(tmp_path: Path, capsys) -> None:
    import pytest

    from sim.cli.main import main
    from sim.core.errors import ApcsimError
    from sim.experiment.tracked import refuse_tracked, tracked_files

    if tracked_files(ROOT / "results" / "sidechannel") == 0:
        pytest.skip("not a git checkout with the committed results")
    with pytest.raises(ApcsimError, match="committed to the repository.*--force"):
        refuse_tracked(ROOT / "results" / "sidechannel", False, "study")
    refuse_tracked(ROOT / "results" / "sidechannel", True, "study")  # --force
    refuse_tracked(tmp_path, False, "study")  # not tracked: nothing to refuse
    assert main(["sidechannel", str(ROOT / "configs" / "sidechannel.yaml"), "--output-dir",
                 str(ROOT / "results"), "--no-progress"]) == 2
    assert "results/sidechannel: holds" in capsys.readouterr().err


def test_kv_cache_fraction_scales_vllms_default_pool() -> None:
    import pytest

    from sim.core.errors import ApcsimError
    from sim.experiment.config import config_to_dict, load_config
    from sim.experiment.engine_description import resolve

    path = ROOT / "configs" / "my_trace.yaml"
    full = resolve(load_config(path)).num_gpu_blocks
    assert resolve(load_config(path, ["engine.kv_cache_fraction=0.5"])).num_gpu_blocks == full // 2
    assert resolve(load_config(path, ["engine.kv_cache_fraction=1"])).num_gpu_blocks == full
    assert "kv_cache_fraction" not in config_to_dict(load_config(path))["engine"]  # point keys unchanged
    for other in ("engine.num_gpu_blocks=1000", "engine.kv_cache_gib=4"):
        with pytest.raises(ApcsimError, match="set one of num_gpu_blocks or kv_cache_gib or kv_cache_fraction"):
            load_config(path, ["engine.kv_cache_fraction=0.5", other])
    for bad in ("0", "1.5"):
        with pytest.raises(ApcsimError, match="kv_cache_fraction"):
            load_config(path, [f"engine.kv_cache_fraction={bad}"])
    with pytest.raises(ApcsimError, match="max_model_len"):  # too small a share is vLLM's start-up refusal
        resolve(load_config(path, ["engine.kv_cache_fraction=0.01"]))


def test_version_names_apcsim_the_vllm_mirrored_and_the_compiled_modules(capsys) -> None:
    from sim.cli.main import main
    from sim.core.native_build import ENGINE_MODULES, interpreted_engine_modules

    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"apcsim \S+", lines[0])
    assert lines[1] == "mirrors vLLM 0.33.0 (default; engine.vllm_version: 0.25.1 too)"
    native = len(ENGINE_MODULES) - len(interpreted_engine_modules())
    assert lines[2].startswith(f"compiled: engine modules (mypyc) {native} of {len(ENGINE_MODULES)}; Cython: ")
    assert all(f"{what} " in lines[2] for what in ("block pool", "hash chain", "trace scanner", "KV-event index"))
