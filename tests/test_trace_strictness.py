"""Strict trace input, checked against the trace parser (``workloads.trace_format``,
``workloads.trace_lines``, ``workloads.trace_json``)."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli.main import main
from sim.core.pool_impl import compiled_pool_class
from workloads.trace_format import TraceFormatError, read_trace
from workloads.trace_lines import trace_lines

ENGINE = {"block_size": 16, "num_gpu_blocks": 400, "max_model_len": 4096}


def _records(n: int = 6, offset: float = 0.0, gap: float = 0.013) -> list[dict]:
    return [{"id": f"r{i}", "arrival": offset + gap * i, "tokens": list(range(50 * i, 50 * i + 40)),
             "output_tokens": 3} for i in range(n)]


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _run(tmp_path: Path, trace: Path, name: str = "t", **workload) -> tuple[int, Path]:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"name": name, "engine": ENGINE, "latency": {"kind": "fixed", "step_time_s": 0.01},
                                   "workload": {"kind": "trace", "path": str(trace), **workload}}))
    out = tmp_path / f"out_{name}"
    return main(["run", str(cfg), "--no-progress", "--out", str(out)]), out


@pytest.mark.parametrize(("line", "field"), [
    ('{"id": "a", "arrival": NaN, "tokens": [1, 2], "output_tokens": 2}', "arrival"),
    ('{"id": "a", "arrival": Infinity, "tokens": [1, 2], "output_tokens": 2}', "arrival"),
    ('{"id": "a", "arrival": 0, "tokens": [1, 2], "output_tokens": Infinity}', "output_tokens"),
    ('{"id": "a", "arrival": 0, "tokens": [1, NaN], "output_tokens": 2}', "tokens"),
])
def test_non_finite_numbers_in_a_trace_are_refused(tmp_path, line, field):
    p = tmp_path / "nf.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(TraceFormatError, match=rf"nf\.jsonl:1: field '{field}'"):
        list(read_trace(p))


def test_output_tokens_too_large_for_the_simulator_is_one_line(tmp_path, capsys):
    p = tmp_path / "big.jsonl"
    p.write_text(_jsonl([{**_records(1)[0], "output_tokens": 2**24}]))
    compiled_pool_class()  # its one-time "not built" notice (a checkout without the build) is not this error
    capsys.readouterr()
    code, _ = _run(tmp_path, p)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "output_tokens" in err and err.startswith("apcsim: error: "), err


def test_output_tokens_too_large_is_a_trace_format_error(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text(_jsonl([{**_records(1)[0], "output_tokens": 2**24}]))
    with pytest.raises(TraceFormatError, match=r"big\.jsonl:1: field 'output_tokens'"):
        list(read_trace(p))


def test_non_utf8_trace_line_is_named_and_skippable(tmp_path):
    p = tmp_path / "enc.jsonl"
    p.write_bytes(_jsonl(_records(2)).encode() + b'{"id": "caf\xe9"}\n')
    with pytest.raises(TraceFormatError, match=r"enc\.jsonl:3: .*not UTF-8"):
        list(read_trace(p))
    reader = read_trace(p, skip_bad_lines=True)
    assert len(list(reader)) == 2 and reader.skipped == 1


@pytest.mark.parametrize("suffix", [".gz", ".xz", ".zst"])
def test_compressed_traces_are_read_transparently(tmp_path, suffix):
    data = _jsonl(_records(4)).encode()
    p = tmp_path / f"t.jsonl{suffix}"
    if suffix == ".gz":
        p.write_bytes(gzip.compress(data))
    elif suffix == ".xz":
        p.write_bytes(lzma.compress(data))
    else:
        zstd = pytest.importorskip("zstandard")
        p.write_bytes(zstd.ZstdCompressor().compress(data))
    assert [r.id for r in read_trace(p)] == ["r0", "r1", "r2", "r3"]
    # the line-by-line path (no compiled scanner; the Mooncake loader) decompresses alike
    assert [raw for _, raw, _ in trace_lines(p, scan=False)] == data.splitlines(keepends=True)


def test_a_directory_as_trace_path_says_so(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    code, _ = _run(tmp_path, tmp_path / "d")
    err = capsys.readouterr().err
    assert code == 2 and "directory" in err and "no such file" not in err, err


def test_duplicate_key_in_a_trace_line_names_file_line_and_key(tmp_path):
    p = tmp_path / "dup.jsonl"
    p.write_text('{"id": "a", "arrival": 0, "tokens": [1, 2], "output_tokens": 2, "output_tokens": 9}\n')
    with pytest.raises(TraceFormatError, match=r"dup\.jsonl:1: .*duplicate.*output_tokens"):
        list(read_trace(p))


def test_epoch_timestamps_lose_nothing(tmp_path):
    """1.7e12 s of offset (epoch seconds as a float): the same TTFTs as the trace from 0."""
    plain, epoch = tmp_path / "plain.jsonl", tmp_path / "epoch.jsonl"
    plain.write_text(_jsonl(_records(20)))
    epoch.write_text(_jsonl(_records(20, offset=1.7e12)))
    assert _run(tmp_path, plain, "plain")[0] == 0 and _run(tmp_path, epoch, "epoch")[0] == 0
    a = pd.read_parquet(tmp_path / "out_plain" / "requests.parquet")
    b = pd.read_parquet(tmp_path / "out_epoch" / "requests.parquet")
    assert (a["ttft"] - b["ttft"]).abs().max() < 1e-9
    assert (b["ttft"] > 0).all()


def test_an_empty_trace_is_an_error(tmp_path, capsys):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    code, out = _run(tmp_path, p)
    assert code == 2 and "empty" in capsys.readouterr().err and not out.exists()


def test_an_all_skipped_trace_is_an_error(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text("x\ny\n")
    code, out = _run(tmp_path, p, skip_bad_lines=True)
    assert code == 2 and "skipped" in capsys.readouterr().err and not out.exists()


def test_a_sweep_over_an_all_skipped_trace_is_not_ok(tmp_path):
    from sim.experiment.sweep import run_sweep

    p = tmp_path / "bad.jsonl"
    p.write_text("x\ny\n")
    base = {"name": "s", "engine": ENGINE, "latency": {"kind": "fixed", "step_time_s": 0.01},
            "workload": {"kind": "trace", "path": str(p), "skip_bad_lines": True}}
    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump({"name": "s", "base": base, "grid": {"seed": [0]}, "bounds": False}))
    rep = run_sweep(sw, workers=1, progress=False, output_dir=str(tmp_path / "out"))
    assert list(rep.table["status"]) == ["error"]
