import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim.core.request import token_array
from workloads.bounds import infinite_cache_hit_bound
from workloads.mooncake import expand_hash_ids, load_mooncake, mooncake_stats
from workloads.paths import shared_traces_dir
from workloads.trace_format import TraceFormatError

MOONCAKE = shared_traces_dir() / "mooncake"
CONV = MOONCAKE / "conversation_trace.jsonl"
SYNTH = MOONCAKE / "synthetic_trace.jsonl"

needs_traces = pytest.mark.skipif(not CONV.is_file(), reason="shared traces not present")


def _write(path, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write(r if isinstance(r, str) else json.dumps(r))
            fh.write("\n")
    return path


def _row(ts=0, n_in=600, n_out=5, ids=(0, 1)):
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)}


def test_paths_helper():
    assert shared_traces_dir().name == "traces" and shared_traces_dir().parent.name == "shared"
    assert shared_traces_dir() == Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@needs_traces
def test_conversation_stats():
    s = mooncake_stats(CONV)
    assert s["requests"] == 12031
    assert s["prompt_tokens"] == 144_793_823
    assert s["max_input_length"] == 126_195
    assert abs(s["block_hit_bound"] - 0.366) <= 0.0005


@needs_traces
def test_synthetic_stats():
    s = mooncake_stats(SYNTH)
    assert abs(s["block_hit_bound"] - 0.640) <= 0.0005


@needs_traces
def test_first_request_expansion():
    first_line = json.loads(CONV.open().readline())
    req = next(load_mooncake(CONV))
    assert req.id == "mc-0" and req.arrival == 0.0 and req.output_tokens == 500
    assert len(req.tokens) == first_line["input_length"] == 6758
    expected = np.concatenate([np.arange(h * 512, h * 512 + 512) for h in first_line["hash_ids"]])[:6758]
    tokens = token_array(req.tokens)  # the loader keeps prompts as block ids until needed
    assert tokens.dtype == np.int64 and np.array_equal(tokens, expected)
    assert tokens[-1] == 13 * 512 + (6758 - 13 * 512) - 1  # last block partial


@needs_traces
def test_lazy_generator_start_limit_scale():
    gen = load_mooncake(CONV, time_scale=0.5, start=100, limit=3, max_output_tokens=10)
    assert inspect.isgenerator(gen)
    reqs = list(gen)
    assert [r.id for r in reqs] == ["mc-100", "mc-101", "mc-102"]
    lines = CONV.open().read().splitlines()[100:103]
    for r, line in zip(reqs, lines):
        row = json.loads(line)
        assert r.arrival == row["timestamp"] / 1000 * 0.5
        assert r.output_tokens == min(row["output_length"], 10)
        assert len(r.tokens) == row["input_length"]


@needs_traces
def test_token_bound_matches_id_computation():
    """At the trace's block size the expanded token bound equals a direct computation on ids."""
    n = 1500
    hit = total = 0
    seen = set()
    with CONV.open() as fh:
        for _ in range(n):
            row = json.loads(fh.readline())
            L, ids = row["input_length"], row["hash_ids"]
            total += L
            full = ids[: L // 512]
            k = 0
            for h in full[: (L - 1) // 512]:
                if h not in seen:
                    break
                k += 1
            hit += k * 512
            seen.update(full)
    b512 = infinite_cache_hit_bound(load_mooncake(CONV, limit=n), 512)
    assert b512 == pytest.approx(hit / total, abs=1e-12)
    b64 = infinite_cache_hit_bound(load_mooncake(CONV, limit=n), 64)
    assert b64 >= b512


def test_expand_and_tokens_per_id(tmp_path):
    assert expand_hash_ids(np.array([2, 5]), 5, 3).tolist() == [6, 7, 8, 15, 16]
    path = _write(tmp_path / "m.jsonl", [_row(n_in=5, ids=(2, 5)), _row(ts=1500, n_in=3, ids=(9,))])
    reqs = list(load_mooncake(path, tokens_per_id=3))
    assert token_array(reqs[0].tokens).tolist() == [6, 7, 8, 15, 16]
    assert token_array(reqs[1].tokens).tolist() == [27, 28, 29] and reqs[1].arrival == 1.5


@pytest.mark.parametrize(
    "row, field, problem",
    [
        (_row(n_out=0), "output_length", "expected int >= 1 (vLLM needs max_tokens >= 1), got 0"),
        (_row(n_in=0, ids=()), "input_length", "expected int >= 1, got 0"),
        (_row(ts=-1), "timestamp", "expected finite number >= 0"),
        (_row(ids=(0,)), "hash_ids", "expected ceil(input_length / 512) = 2 ids, got 1"),
        (_row(ids=(0, -1)), "hash_ids", "id at index 1 out of range"),
        (_row(ids=(0, 1.5)), "hash_ids", "id at index 1: expected int, got 1.5"),
        ({**_row(), "extra": 1}, "extra", "unknown field"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1}, "hash_ids", "missing required field"),
    ],
)
def test_mooncake_errors(tmp_path, row, field, problem):
    path = _write(tmp_path / "m.jsonl", [_row(), row])
    with pytest.raises(TraceFormatError) as info:
        list(load_mooncake(path))
    err = info.value
    assert (err.line, err.field) == (2, field)
    assert str(err).startswith(f"{path}:2: field '{field}': ") and problem in str(err)
    with pytest.raises(TraceFormatError):
        mooncake_stats(path)


def test_mooncake_unsorted_and_malformed(tmp_path):
    path = _write(tmp_path / "m.jsonl", [_row(ts=5), _row(ts=4)])
    with pytest.raises(TraceFormatError, match=r"m\.jsonl:2: field 'timestamp'"):
        list(load_mooncake(path))
    path = _write(tmp_path / "n.jsonl", [_row(), "{bad"])
    with pytest.raises(TraceFormatError, match=r"n\.jsonl:2: malformed JSON"):
        list(load_mooncake(path))


def test_argument_validation(tmp_path):
    path = _write(tmp_path / "m.jsonl", [_row()])
    with pytest.raises(ValueError):
        load_mooncake(path, time_scale=0)
    with pytest.raises(ValueError):
        load_mooncake(path, tokens_per_id=0)
    with pytest.raises(FileNotFoundError):
        load_mooncake(tmp_path / "missing.jsonl")
    assert list(load_mooncake(path, limit=0)) == []
    s = mooncake_stats(path)
    assert s["requests"] == 1 and s["block_hit_bound"] == 0.0 and math.isclose(s["duration_s"], 0.0)
