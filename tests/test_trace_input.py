"""Trace input: the compiled fast parser against the stdlib slow path, and the strictness rules
(duplicate keys, non-finite numbers, non-UTF-8 lines, compressed files, a directory as path,
output_tokens >= 2**24, epoch arrivals, empty and all-skipped traces), for canonical traces and
the Mooncake loader."""

from __future__ import annotations

import gzip
import json
import lzma
from decimal import Decimal

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workloads.trace_lines as trace_lines
from sim.core.request import token_array
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from workloads.mooncake import load_mooncake
from workloads.tokens import RunTokens
from workloads.trace_format import TraceFormatError, TraceRequest, read_trace, write_trace
from workloads.trace_lines import TraceInputError

pytestmark = pytest.mark.skipif(trace_lines._scan_lines is None, reason="the compiled trace scanner is not built")


def _write(path, lines: list[str | bytes]) -> str:
    with open(path, "wb") as fh:
        for line in lines:
            fh.write(line if isinstance(line, bytes) else line.encode())
            fh.write(b"\n")
    return str(path)


def _line(**kw) -> str:
    obj = {"id": "r0", "arrival": 0.0, "tokens": [1, 2, 3], "output_tokens": 4}
    obj.update(kw)
    return json.dumps(obj)


def _read(path, slow: bool = False, **kw) -> list[TraceRequest]:
    if not slow:
        return list(read_trace(path, **kw))
    saved = trace_lines._scan_lines
    trace_lines._scan_lines = None
    try:
        return list(read_trace(path, **kw))
    finally:
        trace_lines._scan_lines = saved


def _error(path, **kw) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path, **kw))
    return info.value


def _same(a: TraceRequest, b: TraceRequest) -> None:
    for field in TraceRequest.__slots__:
        x, y = getattr(a, field), getattr(b, field)
        if field in ("tokens", "output_token_ids"):
            assert (x is None) == (y is None), field
            if x is not None:
                assert token_array(x).tolist() == token_array(y).tolist(), field
        else:
            assert x == y and type(x) is type(y), field


# -- the fast parser is the slow one, faster ----------------------------------------------------
_ids = st.integers(0, (1 << 62) - 1)
_runs = st.lists(st.tuples(st.integers(0, 10**12), st.integers(1, 40)), min_size=1, max_size=6)
_tokens = st.one_of(
    st.lists(_ids, min_size=1, max_size=30),
    _runs.map(lambda rs: [s + k for s, n in rs for k in range(n)]),
)
_spacing = st.sampled_from([(",", ":"), (", ", ": "), (" ,  ", " :\t")])


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(st.tuples(_tokens, st.integers(1, 50), st.booleans(), st.sampled_from([None, "s", "t\"]"])),
                        min_size=1, max_size=6),
       spacing=_spacing)
def test_fast_parser_equals_slow_parser(tmp_path_factory, records, spacing):
    lines = []
    for i, (toks, n_out, with_outs, salt) in enumerate(records):
        obj = {"salt": salt, "id": f"r{i}", "tokens": toks, "arrival": 0.25 * i, "output_tokens": n_out}
        if with_outs:
            obj["output_token_ids"] = list(range(7, 7 + n_out))
        lines.append(json.dumps(obj, separators=spacing))
    path = _write(tmp_path_factory.mktemp("fast") / "t.jsonl", lines)
    fast, slow = _read(path), _read(path, slow=True)
    assert len(fast) == len(slow) == len(records)
    for a, b in zip(fast, slow):
        _same(a, b)


def test_runs_of_consecutive_ids_stay_compact(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_line(id="a", tokens=list(range(100, 612))),
                                         _line(id="b", tokens=[5, 9, 2, 7, 1])])
    a, b = _read(path)
    assert isinstance(a.tokens, RunTokens) and a.tokens.num_runs == 1 and len(a.tokens) == 512
    assert isinstance(b.tokens, np.ndarray) and b.tokens.tolist() == [5, 9, 2, 7, 1]


@pytest.mark.parametrize("line", [
    '{"id":"a","arrival":0,"tokens":[1,2,-3],"output_tokens":1}',  # a negative id
    '{"id":"a","arrival":0,"tokens":[1,2.0],"output_tokens":1}',  # a float
    '{"id":"a","arrival":0,"tokens":[01],"output_tokens":1}',  # a leading zero
    '{"id":"a","arrival":0,"tokens":[4611686018427387904],"output_tokens":1}',  # 2**62
    '{"id":"a","arrival":0,"tokens":[],"output_tokens":1}',
    '{"id":"a","arrival":0,"tokens":[1,[2]],"output_tokens":1}',
    '{"id":"a","arrival":0,"tok\\u0065ns":[1],"output_tokens":1}',  # an escaped key: still "tokens"
    '{"id":"a","arrival":0,"tokens":[1,2],"output_tokens":1} x',
])
def test_unusual_lines_take_the_slow_path_and_agree(tmp_path, line):
    path = _write(tmp_path / "t.jsonl", [line])
    outcomes = []
    for slow in (False, True):
        try:
            outcomes.append(("ok", [token_array(r.tokens).tolist() for r in _read(path, slow=slow)]))
        except TraceFormatError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]


# -- strictness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("line, key", [
    ('{"id":"a","arrival":0,"tokens":[1,2],"output_tokens":1,"output_tokens":5}', "output_tokens"),
    ('{"id":"a","arrival":0,"tokens":[1,2],"tokens":[3],"output_tokens":1}', "tokens"),
    ('{"id":"a","arrival":0,"arrival":1,"tokens":[1],"output_tokens":1}', "arrival"),
])
def test_duplicate_keys_are_errors_naming_file_line_and_key(tmp_path, line, key):
    path = _write(tmp_path / "t.jsonl", [_line(id="ok"), line])
    err = _error(path)
    assert str(err) == f"{path}:2: field '{key}': duplicate key '{key}'"


@pytest.mark.parametrize("arrival", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_arrivals_are_errors(tmp_path, arrival):
    path = _write(tmp_path / "t.jsonl", [f'{{"id":"a","arrival":{arrival},"tokens":[1],"output_tokens":1}}'])
    err = _error(path)
    assert (err.line, err.field) == (1, "arrival") and "finite" in str(err)


def test_non_utf8_line_is_an_error_and_skippable(tmp_path):
    bad = b'{"id":"a","arrival":0,"tokens":[1],"output_tokens":1,"salt":"\xff"}'
    path = _write(tmp_path / "t.jsonl", [_line(id="x"), bad, _line(id="y", arrival=1)])
    assert str(_error(path)) == f"{path}:2: not UTF-8"
    reader = read_trace(path, skip_bad_lines=True)
    assert [r.id for r in reader] == ["x", "y"] and reader.skipped == 1 and reader.skipped_lines == [2]


def test_output_tokens_limit(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_line(output_tokens=1 << 24)])
    assert str(_error(path)) == f"{path}:1: field 'output_tokens': expected int < 2**24 (16777216), got 16777216"
    assert _read(_write(tmp_path / "ok.jsonl", [_line(output_tokens=(1 << 24) - 1)]))[0].output_tokens == (1 << 24) - 1


@pytest.mark.parametrize("suffix, opener", [(".gz", gzip.open), (".xz", lzma.open), (".zst", zstandard.open)])
def test_compressed_traces_are_read_transparently(tmp_path, suffix, opener):
    reqs = [TraceRequest(f"r{i}", 0.5 * i, np.arange(i, i + 40, dtype=np.int64), 3) for i in range(5)]
    plain = tmp_path / "t.jsonl"
    write_trace(plain, reqs)
    packed = tmp_path / f"t.jsonl{suffix}"
    with opener(packed, "wb") as fh:
        fh.write(plain.read_bytes())
    for a, b in zip(_read(plain), _read(packed), strict=True):
        _same(a, b)


def test_directory_as_trace_path(tmp_path):
    with pytest.raises(TraceInputError, match="is a directory"):
        read_trace(tmp_path)
    cfg = config_from_dict({"name": "d", "workload": {"kind": "trace", "path": str(tmp_path)}})
    with pytest.raises(Exception, match=r"workload\.path: .* is a directory"):
        replay_experiment(cfg)


def test_empty_trace_is_an_error(tmp_path):
    for lines in ([], ["", "   "]):
        path = _write(tmp_path / "e.jsonl", lines)
        assert "empty trace" in str(_error(path))


def test_all_skipped_trace_is_an_error_unless_allowed(tmp_path):
    path = _write(tmp_path / "s.jsonl", ["{oops", _line(output_tokens=0)])
    err = _error(path, skip_bad_lines=True)
    assert err.line == 1 and "every line was skipped" in str(err) and "allow_empty" in str(err)
    reader = read_trace(path, skip_bad_lines=True, allow_empty=True)
    assert list(reader) == [] and reader.skipped == 2


def test_arrival_span_limit(tmp_path):
    path = _write(tmp_path / "t.jsonl", [_line(id="a", arrival=5), _line(id="b", arrival=5 + 2.0**32 + 1)])
    err = _error(path)
    assert (err.line, err.field) == (2, "arrival") and "2**32 s after the first arrival" in str(err)


# -- epoch timestamps lose nothing --------------------------------------------------------------
def _epoch_trace(path, offset: int) -> str:
    lines = []
    for i in range(30):
        frac = Decimal(i) * Decimal("0.0137")  # not representable in binary: exactness matters
        lines.append(json.dumps({"id": f"r{i}", "arrival": "@", "tokens": list(range(i % 4 * 100, i % 4 * 100 + 70)),
                                 "output_tokens": 5 + i % 7}).replace('"@"', str(offset + frac)))
    return _write(path, lines)


def test_epoch_offset_changes_no_result(tmp_path):
    results = []
    for offset in (0, 1_700_000_000_000):
        path = _epoch_trace(tmp_path / f"e{offset}.jsonl", offset)
        reader = read_trace(path)
        arrivals = [r.arrival for r in reader]
        assert arrivals[0] == 0.0 and reader.origin_s == float(offset)
        cfg = config_from_dict({
            "name": "epoch", "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_model_len": 256},
            "latency": {"kind": "fixed", "step_time_s": 0.01},
            "workload": {"kind": "trace", "path": path},
        })
        res, _ = replay_experiment(cfg, progress=False)
        results.append((arrivals, res.requests))
    (a0, t0), (a1, t1) = results
    assert a0 == a1
    for col in ("arrival", "first_token", "finish", "ttft", "tpot", "e2e", "hit_tokens"):
        assert t0[col].tolist() == t1[col].tolist(), col


# -- the Mooncake loader has the same strictness ------------------------------------------------
def _mc(ts=0, n_in=600, n_out=5, ids=(0, 1)) -> str:
    return json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)})


def test_mooncake_strictness(tmp_path):
    dup = '{"timestamp":0,"input_length":600,"output_length":5,"output_length":6,"hash_ids":[0,1]}'
    cases = [
        (dup, "field 'output_length': duplicate key 'output_length'"),
        (_mc().encode()[:-1] + b' ,"x":"\xfe"}', "not UTF-8"),
        (_mc(n_out=1 << 24), "field 'output_length': expected int < 2**24"),
    ]
    for i, (line, problem) in enumerate(cases):
        path = _write(tmp_path / f"m{i}.jsonl", [_mc(), line])
        with pytest.raises(TraceFormatError) as info:
            list(load_mooncake(path))
        assert str(info.value) == f"{path}:2: {problem}" or str(info.value).startswith(f"{path}:2: {problem}")
    empty = _write(tmp_path / "empty.jsonl", [])
    with pytest.raises(TraceFormatError, match="empty trace"):
        list(load_mooncake(empty))
    bad = _write(tmp_path / "bad.jsonl", ["{oops"])
    with pytest.raises(TraceFormatError, match="every line was skipped"):
        list(load_mooncake(bad, skip_bad_lines=True))
    assert list(load_mooncake(bad, skip_bad_lines=True, allow_empty=True)) == []
    gz = tmp_path / "m.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(_mc() + "\n" + _mc(ts=5) + "\n")
    assert [r.arrival for r in load_mooncake(gz)] == [0.0, 0.005]
    with pytest.raises(TraceInputError, match="is a directory"):
        load_mooncake(tmp_path)


def test_mooncake_prompts_are_runs(tmp_path):
    path = _write(tmp_path / "m.jsonl", [_mc(n_in=1100, ids=(3, 4, 9))])
    (r,) = load_mooncake(path)
    assert isinstance(r.tokens, RunTokens) and r.tokens.num_runs == 2  # ids 3, 4 touch; 9 does not
    assert token_array(r.tokens).tolist() == [h * 512 + k for h in (3, 4, 9) for k in range(512)][:1100]


def test_line_count_is_deferred(tmp_path):
    from workloads.registry import build_workload
    from workloads.schema import TraceWorkload

    path = _write(tmp_path / "t.jsonl", [_line(id=f"r{i}", arrival=i) for i in range(7)])
    wl = build_workload(TraceWorkload(kind="trace", path=path), seed=0)
    assert callable(wl.total) and wl.total() == 7
