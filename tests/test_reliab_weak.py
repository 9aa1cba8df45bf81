"""Issue 37's weak cases of hostile input -- the right outcome with a traceback or a misleading
message -- as one table: each row builds its input, runs ``apcsim`` through its entry point and
expects exit code 2 and exactly one ``apcsim: error:`` line holding the given words (a message of
several problems continues on plain lines). Rows that were a decision rather than a message are
tested below the table, each with its reason.
"""

from __future__ import annotations

import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from sim.cli.main import main

LINES = b"".join(b'{"id":"r%d","arrival":%d.0,"tokens":[%d,2,3,4,5,6,7,8],"output_tokens":2}\n' % (i, i, i)
                 for i in range(400))
BASE = {
    "name": "w", "engine": {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096},
    "latency": {"kind": "fixed", "step_time_s": 0.01},
    "workload": {"kind": "synthetic_shared_prefix", "num_requests": 6, "prefix_tokens": 64, "suffix_tokens": 16,
                 "output_tokens": 2, "rate": 50.0},
}


def _config(tmp: Path, data: dict, name: str = "base.yaml") -> str:
    p = tmp / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _trace_run(tmp: Path, name: str, data: bytes) -> list[str]:
    (tmp / name).write_bytes(data)
    return ["run", _config(tmp, {**BASE, "workload": {"kind": "trace", "path": name}}), "--out", str(tmp / "o"),
            "--no-progress", "--no-bounds"]


def _fifo_run(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "t.jsonl")
    return ["run", _config(tmp, {**BASE, "workload": {"kind": "trace", "path": "t.jsonl"}}), "--out", str(tmp / "o")]


def _stats_of_truncated_gz(tmp: Path) -> list[str]:
    (tmp / "t.jsonl.gz").write_bytes(gzip.compress(LINES)[:300])
    return ["workloads", "stats", _config(tmp, {**BASE, "workload": {"kind": "trace", "path": "t.jsonl.gz"}})]


def _run(tmp: Path, data: dict, *extra: str) -> list[str]:
    return ["run", _config(tmp, data), "--out", str(tmp / "o"), "--no-progress", "--no-bounds", *extra]


def _fleet(**cluster: object) -> dict:
    return {**BASE, "cluster": {"replicas": 2, "router": "round_robin", **cluster}}


def _explain(tmp: Path, damage: Callable[[Path], None]) -> list[str]:
    """A real attribution run, damaged, then ``apcsim explain`` on it."""
    assert main(_run(tmp, {**BASE, "replay": {"attribution": "full"}})) == 0
    damage(tmp / "o")
    return ["explain", str(tmp / "o"), "--request", "syn-0"]


def _foreign_blocks(folder: Path) -> None:
    import pandas as pd

    pd.DataFrame({"request_id": ["syn-0"], "x": [1]}).to_parquet(folder / "blocks.parquet")


def _incomplete(folder: Path) -> None:
    meta = folder / "meta.json"
    meta.write_text(meta.read_text().replace('"complete": true', '"complete": false'))


def _plot_damaged(tmp: Path) -> list[str]:
    sweep = {"name": "sw", "output_dir": str(tmp), "base": BASE, "bounds": False, "grid": {"engine.block_size": [16]}}
    assert main(["sweep", _config(tmp, sweep, "sweep.yaml"), "--workers", "1", "--no-plots", "--no-progress"]) == 0
    (tmp / "sw" / "table.parquet").write_bytes(b"PAR1 garbage")
    return ["plot", str(tmp / "sw")]


Row = tuple[str, Callable[[Path], list[str]], str]
ROWS: list[Row] = [
    # tracebacks that are one line now
    ("truncated .gz", lambda t: _trace_run(t, "t.jsonl.gz", gzip.compress(LINES)[:300]),
     "t.jsonl.gz: truncated .gz file"),
    ("corrupt .gz", lambda t: _trace_run(t, "t.jsonl.gz", b"\x1f\x8b\x08\x00garbage-garbage-garbage"),
     "t.jsonl.gz: corrupt .gz data"),
    ("not gzip at all", lambda t: _trace_run(t, "t.jsonl.gz", b"plain text, not gzip\n"),
     "t.jsonl.gz: corrupt .gz data"),
    ("truncated .xz", lambda t: _trace_run(t, "t.jsonl.xz", lzma.compress(LINES)[:200]),
     "t.jsonl.xz: truncated .xz file"),
    ("corrupt .xz", lambda t: _trace_run(t, "t.jsonl.xz", b"\xfd7zXZ\x00garbage-garbage"), "t.jsonl.xz: corrupt .xz"),
    ("corrupt .zst", lambda t: _trace_run(t, "t.jsonl.zst", b"garbage, not zstd at all"),
     "t.jsonl.zst: corrupt .zst data"),
    ("workloads stats on a truncated .gz", _stats_of_truncated_gz, "t.jsonl.gz: truncated .gz file"),
    ("true/false in a token list", lambda t: _trace_run(t, "t.jsonl", b'{"id":"a","arrival":0,"tokens":[true,2,3],'
                                                                         b'"output_tokens":2}\n'),
     "t.jsonl:1: field 'tokens': token id at index 0: expected int, got True"),
    ("explain on a corrupt blocks.parquet", lambda t: _explain(t, lambda f: (f / "blocks.parquet").write_bytes(b"x")),
     "o: cannot read its tables"),
    ("explain on a wrong-schema blocks.parquet", lambda t: _explain(t, _foreign_blocks),
     "o: a table lacks the column 'block'"),
    ("plot on a corrupt table.parquet", _plot_damaged, "sw: cannot read its tables"),
    # misleading messages
    ("explain on a folder an interrupted run left", lambda t: _explain(t, _incomplete),
     "o: not a complete results folder"),
    ("explain on a missing folder", lambda t: ["explain", str(t / "nothing"), "--request", "0"],
     "nothing: no such results folder"),
    ("a FIFO as trace", _fifo_run, "t.jsonl: is a FIFO, not a regular file"),
    ("pydantic internals in a key path", lambda t: _run(t, _fleet(kv_events={"delay_s": {"dist": "lognormal",
                                                                                       "mean": 1}})),
     "base.yaml: cluster.kv_events.delay_s: Input should be a valid number"),
    # --set errors name where the value came from
    ("--set value found bad when the engine resolves",
     lambda t: _run(t, BASE, "--set", "engine.num_gpu_blocks=8"),
     "--set engine.num_gpu_blocks=8: engine.num_gpu_blocks: a pool of 8 blocks"),
    ("--set cross-field error names every override in the section",
     lambda t: _run(t, BASE, "--set", "engine.kv_cache_gib=3", "--set", "engine.block_size=32"),
     "--set engine.kv_cache_gib=3, --set engine.block_size=32 (on "),
    ("--set with an empty key part", lambda t: _run(t, BASE, "--set", "engine.=5"),
     "--set engine.=5: 'engine.' has an empty key between its dots"),
    # strictness the README promises: quoted numbers and booleans, true/false for numbers
    ("a quoted number", lambda t: _run(t, {**BASE, "engine": {**BASE["engine"], "max_model_len": "4096"}}),
     "base.yaml: engine.max_model_len: a quoted number ('4096'): write 4096 without quotes"),
    ("a quoted boolean", lambda t: _run(t, {**BASE, "engine": {**BASE["engine"], "enable_prefix_caching": "yes"}}),
     "engine.enable_prefix_caching: a quoted boolean ('yes'): write true without quotes"),
    ("true for a number", lambda t: _run(t, {**BASE, "seed": True}), "base.yaml: seed: true where a number is due"),
    ("a number for true/false", lambda t: _run(t, {**BASE, "engine": {**BASE["engine"], "use_eagle": 1}}),
     "engine.use_eagle: a number (1) where true or false is due"),
    ("a quoted number from --set", lambda t: _run(t, BASE, "--set", "seed='7'"),
     "--set seed='7': seed: a quoted number ('7')"),
    # silent choices refused
    ("a 1,200-point sweep without --yes", lambda t: ["sweep", _config(t, {
        "name": "big", "output_dir": str(t), "base": BASE, "grid": {"seed": list(range(1200))}}, "sweep.yaml")],
     "sweep big: 1,200 points (about 7,200 requests to replay), more than 1,000: add --yes"),
    ("llm-d weights all 0", lambda t: _run(t, _fleet(router={"kind": "llm_d", "weights": {"queue": 0, "kv_cache": 0,
                                                                                        "prefix": 0}})),
     "cluster.router.weights: every weight is 0"),
    ("duplicate routers in compare", lambda t: _run(t, _fleet(compare=["random", "random"])),
     "cluster.compare: compare[1] is compare[0] again (random)"),
    ("the primary router again in compare", lambda t: _run(t, _fleet(compare=["round_robin"])),
     "compare[0] is the primary router (round_robin) again"),
    ("a second --slo", lambda t: ["size", _config(t, BASE), "--slo", "ttft_p99=2s", "--slo", "e2e_p90=9s"],
     "--slo given 2 times"),
    ("a bad CLI number", lambda t: ["workloads", "stats", _config(t, BASE), "--block-size", "16,abc"],
     "workloads stats: argument --block-size: expected a whole number, got 'abc'"),
]


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "engine modules are not compiled" not in line]


@pytest.mark.parametrize("name, build, words", ROWS, ids=[r[0] for r in ROWS])
def test_weak_case_is_one_clear_line(tmp_path, capsys, name, build, words):
    rc = main(build(tmp_path))
    err = _error_lines(capsys.readouterr().err)
    assert rc == 2, err
    assert len([line for line in err if line.startswith("apcsim: error: ")]) == 1 and err[0].startswith("apcsim: ")
    assert words in err[0], err[0]
    assert "Traceback" not in "\n".join(err)


def test_an_unreadable_trace_is_one_line(tmp_path, capsys, monkeypatch):
    """PermissionError (root reads every file, so the refusal is simulated at the open)."""
    import workloads.trace_codecs as codecs

    def refuse(path, mode="r", *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(codecs, "open", refuse, raising=False)
    rc = main(_trace_run(tmp_path, "t.jsonl", LINES))
    err = _error_lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and err[0].endswith("t.jsonl: cannot read the trace: permission denied")


def test_a_closed_stdout_ends_quietly(tmp_path):
    """``apcsim run ... | head -1``: no BrokenPipeError traceback, exit code 141 as git's."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "sim.cli", *_run(tmp_path, BASE)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[1])
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 141) and "Traceback" not in err.decode() and "BrokenPipe" not in err.decode()


def test_a_folder_apcsim_wrote_with_attribution_full_is_replaced(tmp_path, capsys):
    """It was refused as 'not apcsim results (blocks.parquet)'."""
    argv = _run(tmp_path, {**BASE, "replay": {"attribution": "full"}})
    assert main(argv) == 0 and (tmp_path / "o" / "blocks.parquet").is_file()
    assert main(argv) == 0, capsys.readouterr().err


def test_a_sweep_says_its_point_count_before_it_starts(tmp_path, capsys):
    sweep = _config(tmp_path, {"name": "two", "output_dir": str(tmp_path), "base": BASE, "bounds": False,
                               "grid": {"engine.block_size": [16, 32]}}, "sweep.yaml")
    assert main(["sweep", sweep, "--workers", "1", "--no-plots", "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"sweep two: 2 points (about 12 requests to replay) -> {tmp_path / 'two'}/"


def test_tiny_and_huge_times_print_as_separate_readable_columns():
    """A 1e-300 s step once printed '0 s4.00e-298 ms9.40e-298 ms': the columns ran together."""
    from sim.cli.summary import render, seconds

    assert [seconds(x) for x in (0.25, 9.9e-5, 1e-7, 3e-10, 1e-300, 3e9)] == [
        "250 ms", "99.0 us", "100 ns", "0.300 ns", "1.00e-300 s", "3.00e+09 s"]
    summary = {f"{k}_{q}_s": v for k in ("ttft", "tpot", "queue_time", "e2e")
               for q, v in (("p50", 1e-300), ("p90", 4e-298), ("p99", 3e9), ("mean", 0.0))}
    row = next(line for line in render(summary, name="x", folder="f", wall_time_s=0.1).splitlines()
               if line.lstrip().startswith("TTFT"))
    assert row.split() == ["TTFT", "1.00e-300", "s", "4.00e-298", "s", "3.00e+09", "s", "0", "s"]


def test_an_output_cut_at_max_model_len_is_marked_and_counted(tmp_path, capsys):
    """A decision: such a request is served (as vLLM serves it, FINISHED_LENGTH_CAPPED), marked
    finish_reason length_capped, counted in the summary and named on the workload line."""
    import json

    import pandas as pd

    trace = (b'{"id":"long","arrival":0.0,"tokens":[' + b",".join(b"%d" % i for i in range(100)) +
             b'],"output_tokens":400}\n{"id":"short","arrival":0.5,"tokens":[1,2,3],"output_tokens":4}\n')
    argv = _trace_run(tmp_path, "t.jsonl", trace)
    cfg = tmp_path / "base.yaml"
    cfg.write_text(cfg.read_text().replace("max_model_len: 4096", "max_model_len: 256"))
    assert main(argv) == 0
    out = capsys.readouterr().out
    req = pd.read_parquet(tmp_path / "o" / "requests.parquet").set_index("request_id")
    assert req.loc["long", "finish_reason"] == "length_capped" and req.loc["long", "output_tokens"] == 156
    assert req.loc["short", "finish_reason"] == "max_tokens" and req.loc["short", "output_tokens"] == 4
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["num_length_capped_requests"] == 1
    assert "1 outputs cut at max_model_len (finish_reason length_capped)" in out


def test_a_fleet_counts_rejected_requests_by_one_rule(tmp_path):
    """A decision (the single engine's rule, sim.replay.metrics): rejected requests are counted,
    never averaged -- num_requests, goodput and every replica's figures are over served requests, and
    the replicas' counts add up to the fleet's."""
    import json

    long = b",".join(b"%d" % i for i in range(300))
    trace = b"".join(b'{"id":"r%d","arrival":%d.0,"tokens":[%s],"output_tokens":2}\n'
                     % (i, i, long if i % 3 == 0 else b"1,2,3,4,5,6,7,8") for i in range(12))
    argv = _trace_run(tmp_path, "t.jsonl", trace)
    data = yaml.safe_load((tmp_path / "base.yaml").read_text())
    data["engine"]["max_model_len"] = 256
    data["cluster"] = {"replicas": 2, "router": "round_robin", "ttft_slo_s": 10.0}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(data))
    assert main(argv) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    c = s["cluster"]
    assert s["num_requests"] == 8 and s["num_rejected_requests"] == 4
    assert sum(r["num_requests"] for r in c["replicas"]) == 8
    assert sum(r["num_rejected_requests"] for r in c["replicas"]) == 4
    assert c["goodput_fraction"] == 1.0  # every served request met a 10 s SLO; the rejected are not in it
