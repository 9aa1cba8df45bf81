"""Issue 37's eight bad cases of hostile input (wrong results, lost data, a dead machine), one test
each, run through ``apcsim``'s own entry point where the user meets them: each failed on the main
of 2026-12-07 and passes since.

1. a ``.zst`` trace cut inside a frame replayed part of the trace and exited 0;
2. a YAML alias bomb was expanded, validated and printed whole;
3. ``cluster.replicas: 100000`` built the fleet until the machine ran out of memory;
4. a user's folder named like a result file was replaced without a word;
5. ``apcsim size --max-replicas -5`` ran;
6. ``apcsim size --out FILE`` ran every replay before failing;
7. a resumed sweep skipped points whose trace file had changed;
8. ``apcsim run --json`` printed a line before its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
import zstandard

from sim.cli.main import main
from workloads.trace_format import read_trace
from workloads.trace_lines import TraceInputError


def _trace_lines(n: int, start: int = 0) -> bytes:
    return b"".join(
        b'{"id":"r%d","arrival":%d.0,"tokens":[%d,2,3,4,5,6,7,8],"output_tokens":2}\n' % (i, i, i)
        for i in range(start, start + n)
    )


def _trace_config(tmp_path: Path, trace: Path, **extra: object) -> Path:
    cfg = {
        "name": "t", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
        "latency": {"kind": "fixed", "step_time_s": 0.01},
        "workload": {"kind": "trace", "path": str(trace), **extra},
    }
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _stderr_lines(err: str) -> list[str]:
    """stderr's lines, less the one-time note that the engine runs uncompiled (a dev checkout)."""
    return [line for line in err.splitlines() if "engine modules are not compiled" not in line]


# -- 1. truncated .zst ------------------------------------------------------------------------

def _two_frame_zst(tmp_path: Path) -> tuple[bytes, bytes]:
    c = zstandard.ZstdCompressor()
    return c.compress(_trace_lines(1500)), c.compress(_trace_lines(1500, start=1500))


def test_zst_cut_inside_a_frame_is_an_error_naming_the_file(tmp_path, capsys):
    first, second = _two_frame_zst(tmp_path)
    whole = tmp_path / "whole.zst"
    whole.write_bytes(first + second)
    assert sum(1 for _ in read_trace(whole)) == 3000  # frame after frame, to the end
    cut = tmp_path / "cut.zst"
    cut.write_bytes(first + second[: len(second) // 2])
    with pytest.raises(TraceInputError, match=r"cut\.zst: truncated \.zst file"):
        list(read_trace(cut))
    with pytest.raises(TraceInputError, match="truncated"):  # not a bad line: skip_bad_lines does not skip it
        list(read_trace(cut, skip_bad_lines=True))
    rc = main(["run", str(_trace_config(tmp_path, cut, skip_bad_lines=True)), "--out", str(tmp_path / "o"),
               "--no-progress", "--no-bounds"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and err[0].startswith("apcsim: error: ")
    assert "cut.zst: truncated .zst file" in err[0] and not (tmp_path / "o").exists()


def test_zst_cut_inside_its_only_frame_is_an_error(tmp_path):
    first, _ = _two_frame_zst(tmp_path)
    cut = tmp_path / "cut.zst"
    cut.write_bytes(first[: len(first) // 2])
    with pytest.raises(TraceInputError, match="truncated"):
        list(read_trace(cut))


# -- 2. YAML alias bomb, and bad values printed as excerpts ---------------------------------------

_BOMB = """\
name: bomb
latency: {kind: fixed, step_time_s: 0.01}
workload: {kind: synthetic_shared_prefix, num_requests: 4, prefix_tokens: 16, suffix_tokens: 16, output_tokens: 2,
           rate: 1.0}
a: &a [x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
engine: {block_size: 16, num_gpu_blocks: 100, kv_cache_groups: [*e, *e, *e, *e, *e, *e, *e, *e, *e]}
"""


def test_alias_bomb_is_refused_before_validation(tmp_path, capsys):
    p = tmp_path / "bomb.yaml"
    p.write_text(_BOMB)
    rc = main(["run", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and len(err[0]) < 300
    assert "bomb.yaml:" in err[0] and "aliases expand to more than 10,000 nodes" in err[0]


def test_a_few_aliases_still_work(tmp_path):
    from sim.experiment.config import load_config

    p = tmp_path / "ok.yaml"
    p.write_text(_BOMB.split("a: &a")[0].replace("prefix_tokens: 16", "prefix_tokens: &n 16")
                 .replace("suffix_tokens: 16", "suffix_tokens: *n") + "engine: {block_size: *n, num_gpu_blocks: 100}\n")
    assert load_config(p).engine.block_size == 16


def test_a_huge_bad_value_prints_as_a_short_excerpt(tmp_path, capsys):
    p = tmp_path / "big.yaml"
    p.write_text(_BOMB.split("a: &a")[0] + "engine: {block_size: 16, num_gpu_blocks: 100, kv_cache_groups: [" +
                 ", ".join(["[1, 2]"] * 2000) + "]}\n")
    rc = main(["run", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and err[0].startswith("apcsim: error: ") and "kv_cache_groups" in err[0]
    assert len(err) <= 21 and max(len(line) for line in err) < 600
    assert "more problems" in err[-1]
    many = ", ".join(["7"] * 50000)
    p.write_text(_BOMB.split("a: &a")[0] + "engine: {block_size: 16, num_gpu_blocks: [" + many + "]}\n")
    rc = main(["run", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and len(err[0]) < 300
    assert "engine.num_gpu_blocks:" in err[0] and "(got [7, 7, 7" in err[0] and "(50,000 items)" in err[0]


# -- 3. a fleet that cannot fit the machine ------------------------------------------------------

_FLEET = {
    "name": "fleet", "model": "llama-3-8b", "gpu": "H100-SXM", "engine": {"block_size": 16},
    "latency": {"kind": "roofline"},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 6, "prefix_tokens": 64, "suffix_tokens": 16,
                 "output_tokens": 2, "rate": 50.0},
}


def test_a_fleet_too_large_for_the_machine_is_refused_up_front(tmp_path, capsys):
    # the oracle router reads every replica's engine, so every pool is built (with another router
    # at most 6 replicas -- the stream's 6 requests -- would build theirs: sim.experiment.fleet_memory)
    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump({**_FLEET, "cluster": {"replicas": 100000, "router": "oracle"}}))
    rc = main(["run", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and not (tmp_path / "o").exists()
    assert "fleet.yaml: cluster.replicas: a fleet of 100,000 replicas needs about " in err[0]
    assert "GiB of memory" in err[0] and "GiB available" in err[0]


def test_the_fleet_estimate_is_in_the_summary_and_scales_with_the_pool(tmp_path):
    from sim.experiment.config import config_from_dict
    from sim.experiment.engine_description import resolve
    from sim.experiment.fleet_memory import BLOCK_BYTES, check_fleet_memory, estimate_fleet

    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump({**_FLEET, "cluster": {"replicas": 2, "router": "round_robin"}}))
    assert main(["run", str(p), "--out", str(tmp_path / "o"), "--no-progress", "--no-bounds"]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    engine = resolve(config_from_dict({**_FLEET, "cluster": {"replicas": 2}}, "f.yaml"))
    est = estimate_fleet([engine, engine])
    assert summary["cluster"]["memory_estimate_bytes"] == est.total_bytes
    assert estimate_fleet([engine] * 3).total_bytes - est.total_bytes == est.largest_replica_bytes
    assert est.largest_replica_bytes > engine.num_gpu_blocks * BLOCK_BYTES["compiled"]
    with pytest.raises(Exception, match=r"f\.yaml: cluster\.replicas: a fleet of 2 replicas"):
        check_fleet_memory("f.yaml", [engine, engine], available=est.total_bytes)
    assert check_fleet_memory("f.yaml", [engine, engine], available=2 * est.total_bytes) == est


# -- 4. a user's folder named like a result file -------------------------------------------------

@pytest.mark.parametrize("kind", ["folder", "link", "fifo"])
def test_an_entry_named_like_a_result_file_but_not_a_file_is_never_replaced(tmp_path, capsys, kind):
    import os

    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(3))
    out = tmp_path / "out"
    out.mkdir()
    (out / "meta.json").write_text("{}")
    target = out / "summary.json"
    if kind == "folder":
        target.mkdir()
        (target / "inner.txt").write_text("keep me")
    elif kind == "link":
        (tmp_path / "elsewhere.json").write_text("keep me")
        target.symlink_to(tmp_path / "elsewhere.json")
    else:
        os.mkfifo(target)
    rc = main(["run", str(_trace_config(tmp_path, trace)), "--out", str(out), "--no-progress", "--no-bounds"])
    err = _stderr_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and "summary.json (a " in err[0] and "apcsim refuses" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "summary.json"]
    if kind == "folder":
        assert (target / "inner.txt").read_text() == "keep me"


def test_a_folder_of_result_files_is_still_replaced(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(3))
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["run", str(_trace_config(tmp_path, trace)), "--out", str(out), "--no-progress", "--no-bounds"]) == 0
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 3


def test_apcsim_sizes_own_subfolder_is_kept_and_checked(tmp_path, capsys):
    """``apcsim size`` writes into ``<results>/sizing/`` by default: a later run keeps it (it was
    refused as 'not apcsim results (sizing)'); a sizing folder holding anything else is refused."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(3))
    cfg = _trace_config(tmp_path, trace)
    data = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "res")}))
    run = ["run", str(cfg), "--no-progress", "--no-bounds"]
    assert main(run) == 0
    assert main(["size", str(cfg), "--slo", "ttft_p99=2s", "--max-replicas", "2"]) == 0
    sizing = tmp_path / "res" / "t" / "sizing" / "sizing.json"
    kept = sizing.read_bytes()
    assert main(run) == 0 and sizing.read_bytes() == kept
    (sizing.parent / "mine.txt").write_text("a user's file")
    capsys.readouterr()
    assert main(run) == 2 and "not apcsim results (sizing)" in capsys.readouterr().err
    assert (sizing.parent / "mine.txt").read_text() == "a user's file"


# -- 7. a resumed sweep whose trace file changed -------------------------------------------------

def _trace_sweep(tmp_path: Path, trace: Path) -> Path:
    sweep = {
        "name": "resume", "output_dir": str(tmp_path / "sweeps"),
        "base": {"engine": {"num_gpu_blocks": 400, "max_model_len": 4096}, "latency": {"kind": "fixed",
                 "step_time_s": 0.01}, "workload": {"kind": "trace", "path": str(trace)}},
        "grid": {"engine.block_size": [16, 32]}, "bounds": False,
    }
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(sweep))
    return p


def _sweep(args: list[str], capsys) -> tuple[int, str]:
    rc = main(["sweep", *args, "--workers", "1", "--no-plots", "--no-progress"])
    return rc, capsys.readouterr().out


def test_a_resumed_sweep_reruns_points_whose_trace_changed(tmp_path, capsys):
    import pandas as pd

    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(7))
    sweep = _trace_sweep(tmp_path, trace)
    rc, out = _sweep([str(sweep)], capsys)
    assert rc == 0 and "ran 2, skipped 0" in out
    rc, out = _sweep([str(sweep)], capsys)  # unchanged: both skipped
    assert rc == 0 and "ran 0, skipped 2" in out
    trace.write_bytes(_trace_lines(3))
    rc, out = _sweep([str(sweep)], capsys)
    assert rc == 0 and "ran 2 (2 of them again: their input files changed), skipped 0" in out
    table = pd.read_parquet(tmp_path / "sweeps" / "resume" / "table.parquet")
    assert table["num_requests"].tolist() == [3, 3]
    import os

    os.utime(trace, ns=(1, 1))  # touched only, same bytes: still current
    rc, out = _sweep([str(sweep)], capsys)
    assert rc == 0 and "ran 0, skipped 2" in out


# -- 5. and 6. apcsim size: numbers and --out checked before the first replay ----------------------

def _cli(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """``apcsim ARGV``: exit code, stdout, stderr lines (argparse's own errors exit through SystemExit)."""
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out, _stderr_lines(captured.err)


def _size_config(tmp_path: Path) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**_FLEET, "model": "llama-3-8b", "engine": {"block_size": 16, "num_gpu_blocks": 900,
                                                                             "max_model_len": 4096}}))
    return p


@pytest.mark.parametrize("value", ["-5", "0", "abc", "1e9", "99999999"])
def test_size_refuses_a_bad_max_replicas_before_replaying(tmp_path, capsys, value):
    rc, out, err = _cli(["size", str(_size_config(tmp_path)), "--slo", "ttft_p99=2s", "--max-replicas", value,
                         "--out", str(tmp_path / "sz")], capsys)
    assert rc == 2 and "replicas ->" not in out and not (tmp_path / "sz").exists()
    assert any("--max-replicas" in line and value in line for line in err)


def test_size_checks_out_before_the_first_replay(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    rc, out, err = _cli(["size", str(_size_config(tmp_path)), "--slo", "ttft_p99=2s", "--out", str(blocker)], capsys)
    assert rc == 2 and "replicas ->" not in out and blocker.read_text() == "mine"
    assert err == [f"apcsim: error: {blocker}: exists and is not a folder; remove it or pick another --out"]


def test_size_refuses_a_second_slo_and_names_a_bad_router(tmp_path, capsys):
    cfg = str(_size_config(tmp_path))
    rc, out, err = _cli(["size", cfg, "--slo", "ttft_p99=2s", "--slo", "e2e_p90=9s", "--out", str(tmp_path / "z")],
                        capsys)
    assert rc == 2 and err[0].startswith("apcsim: error: --slo given 2 times") and "replicas ->" not in out
    rc, out, err = _cli(["size", cfg, "--slo", "ttft_p99=2s", "--routers", "nope", "--out", str(tmp_path / "z")],
                        capsys)
    assert rc == 2 and err[0].startswith("apcsim: error: --routers nope: not a router")
    assert "cluster.router" not in err[0]


def test_size_writes_sizing_json_with_the_input_fingerprint(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(5))
    cfg = _trace_config(tmp_path, trace)
    rc, out, _ = _cli(["size", str(cfg), "--slo", "ttft_p99=2s", "--max-replicas", "2", "--out", str(tmp_path / "z")],
                      capsys)
    sizing = json.loads((tmp_path / "z" / "sizing.json").read_text())
    assert rc == 0 and sizing["inputs"][str(trace.resolve())]["size"] == trace.stat().st_size


# -- 8. apcsim run --json ------------------------------------------------------------------------

def test_run_json_prints_only_the_json_document_on_stdout(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(3))
    rc, out, err = _cli(["run", str(_trace_config(tmp_path, trace)), "--out", str(tmp_path / "o"), "--json",
                         "--no-progress", "--no-bounds"], capsys)
    doc = json.loads(out)  # the whole of stdout parses
    assert rc == 0 and doc["num_requests"] == 3
    assert err[0] == f"wrote {tmp_path / 'o'}/" and err[-1].startswith("wall time ")


def test_a_resumed_sidechannel_study_reruns_a_point_whose_trace_changed(tmp_path, capsys):
    """Bad case 7 for apcsim sidechannel (it resumes through the same sweep machinery)."""
    study = yaml.safe_load((Path(__file__).parents[1] / "configs" / "sidechannel_chat.yaml").read_text())
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_trace_lines(300))
    study.update(output_dir=str(tmp_path / "out"), workload={"kind": "trace", "path": str(trace)})
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(study))
    argv = ["sidechannel", str(p), "--workers", "1", "--no-plots", "--no-progress"]
    assert main(argv) == 0 and "ran 1, skipped 0" in capsys.readouterr().out
    assert main(argv) == 0 and "ran 0, skipped 1" in capsys.readouterr().out
    trace.write_bytes(_trace_lines(299))
    assert main(argv) == 0 and "ran 1 (1 of them again: their input files changed)" in capsys.readouterr().out
