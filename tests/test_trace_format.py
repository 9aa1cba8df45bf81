import json
import re

import numpy as np
import pytest

from workloads.trace_format import TraceFormatError, TraceRequest, read_trace, write_trace


def _line(**overrides):
    obj = {"id": "r0", "arrival": 0.0, "tokens": [1, 2, 3], "output_tokens": 4}
    obj.update(overrides)
    return obj


def _write_lines(path, objs):
    with open(path, "w") as fh:
        for o in objs:
            fh.write(o if isinstance(o, str) else json.dumps(o))
            fh.write("\n")
    return path


def _error(path):
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    return info.value


def test_round_trip(tmp_path):
    reqs = [
        TraceRequest("a", 0.0, np.array([5, 6, 7], dtype=np.int64), 3),
        TraceRequest(
            "b",
            0.1 + 0.2,  # a float that needs full repr precision
            np.arange(100_000, dtype=np.int64) + (1 << 62) - 100_000,
            2,
            output_token_ids=np.array([9, 8, 7], dtype=np.int64),
            salt="s",
            lora="adapter",
            priority=-2,
            prompt_logprobs=True,
            tenant="t",
            session="sess",
        ),
    ]
    path = tmp_path / "t.jsonl"
    assert write_trace(path, reqs) == 2
    first = path.read_text().splitlines()[0]
    assert first == '{"id":"a","arrival":0.0,"tokens":[5,6,7],"output_tokens":3}'  # compact, defaults omitted
    back = list(read_trace(path))
    assert len(back) == 2
    for a, b in zip(reqs, back):
        for field in TraceRequest.__slots__:
            x, y = getattr(a, field), getattr(b, field)
            if isinstance(x, np.ndarray):
                assert y.dtype == np.int64 and np.array_equal(x, y)
            else:
                assert x == y and type(x) is type(y), field


def test_int_id_and_blank_lines_and_streaming(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [_line(id=7), "   ", _line(id="x", arrival=1)])
    reader = read_trace(path)
    it = iter(reader)
    first = next(it)
    assert first.id == "7" and first.tokens.dtype == np.int64
    rest = list(it)
    assert [r.id for r in rest] == ["x"] and rest[0].arrival == 1.0
    assert reader.skipped == 0 and reader.skipped_lines == []


@pytest.mark.parametrize(
    "obj, field, problem",
    [
        (_line(output_tokens=-3), "output_tokens", "expected int >= 1, got -3"),
        (_line(output_tokens=1.5), "output_tokens", "expected int >= 1, got 1.5"),
        (_line(output_tokens=True), "output_tokens", "expected int >= 1, got True"),
        (_line(arrival=-1.0), "arrival", "expected finite number >= 0, got -1.0"),
        (_line(arrival="0"), "arrival", "expected finite number >= 0, got '0'"),
        (_line(id=None), "id", "expected non-empty str or int, got None"),
        (_line(tokens="abc"), "tokens", "expected a list of ints, got 'abc'"),
        (_line(tokens=[]), "tokens", "expected at least 1 token id(s), got 0"),
        (_line(tokens=[1, 2.5]), "tokens", "token id at index 1: expected int, got 2.5"),
        (_line(tokens=[1, "2"]), "tokens", "token id at index 1: expected int, got '2'"),
        (_line(tokens=[1, [2]]), "tokens", "token id at index 1: expected int, got [2]"),
        (_line(tokens=[True]), "tokens", "token id at index 0: expected int, got True"),
        (_line(tokens=[0, -1]), "tokens", "token id at index 1 out of range [0, 2**62): -1"),
        (_line(tokens=[0, 1 << 62]), "tokens", f"token id at index 1 out of range [0, 2**62): {1 << 62}"),
        (_line(tokens=[1 << 63]), "tokens", f"token id at index 0 out of range [0, 2**62): {1 << 63}"),
        (_line(tokens=[1 << 70]), "tokens", f"token id at index 0 out of range [0, 2**62): {1 << 70}"),
        (_line(tokens=[-1, 1 << 63]), "tokens", "token id at index 0 out of range [0, 2**62): -1"),
        (_line(output_token_ids=[1, 2]), "output_token_ids", "expected length >= output_tokens (4), got 2"),
        (_line(output_token_ids=[1, 2, 3, 1 << 62]), "output_token_ids", "out of range"),
        (_line(salt=3), "salt", "expected str or null, got 3"),
        (_line(lora=["a"]), "lora", "expected str or null, got ['a']"),
        (_line(tenant=1), "tenant", "expected str or null, got 1"),
        (_line(priority="high"), "priority", "expected int, got 'high'"),
        (_line(prompt_logprobs=1), "prompt_logprobs", "expected bool, got 1"),
        (_line(extra=1), "extra", "unknown field"),
        ({"id": "a", "arrival": 0, "tokens": [1]}, "output_tokens", "missing required field"),
    ],
)
def test_field_errors(tmp_path, obj, field, problem):
    path = _write_lines(tmp_path / "trace.jsonl", [_line(id="ok"), "", obj])
    err = _error(path)
    assert isinstance(err, ValueError)
    assert (err.line, err.field) == (3, field)
    assert problem in str(err)
    assert re.fullmatch(rf".*trace\.jsonl:3: field '{field}': .*", str(err))
    assert str(err).startswith(f"{path}:3: field '{field}': ")


def test_example_message_shape(tmp_path):
    path = _write_lines(tmp_path / "trace.jsonl", [_line(output_tokens=-3)])
    assert str(_error(path)) == f"{path}:1: field 'output_tokens': expected int >= 1, got -3"


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '"x"'])
def test_malformed_lines(tmp_path, bad):
    path = _write_lines(tmp_path / "t.jsonl", [_line(), bad])
    err = _error(path)
    assert err.line == 2 and err.field is None
    assert str(err).startswith(f"{path}:2: ")


def test_unsorted_arrivals(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [_line(id="a", arrival=2.0), _line(id="b", arrival=2.0),
                                               _line(id="c", arrival=1.0)])
    err = _error(path)
    assert (err.line, err.field) == (3, "arrival")
    assert "sorted by arrival" in str(err)


def test_duplicate_id(tmp_path):
    path = _write_lines(tmp_path / "t.jsonl", [_line(id=5), _line(id="5", arrival=1)])
    err = _error(path)
    assert (err.line, err.field) == (2, "id")
    assert "duplicate id '5' (first on line 1)" in str(err)


def test_skip_bad_lines_counts(tmp_path):
    lines = [
        _line(id="a", arrival=1.0),
        "{oops",
        _line(id="b", arrival=0.5),  # backwards
        _line(id="a", arrival=2.0),  # duplicate
        _line(id="c", arrival=2.0, tokens=[-5]),
        _line(id="d", arrival=3.0),
    ]
    path = _write_lines(tmp_path / "t.jsonl", lines)
    reader = read_trace(path, skip_bad_lines=True)
    assert [r.id for r in reader] == ["a", "d"]
    assert reader.skipped == 4
    assert reader.skipped_lines == [2, 3, 4, 5]
    # a second pass resets the counters
    assert len(list(reader)) == 2 and reader.skipped == 4


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "nope.jsonl")
