"""Property tests over bad input: trace lines and experiment configs mutated at random
-- random bytes and text, truncations, type swaps, missing and unknown keys, duplicate keys,
non-finite numbers, huge values. The outcome is always a clean result or one of apcsim's own
errors naming the file and line (traces) or the file and key / line, or the ``--set`` override
(configs); never another exception.

The trace-line and config-file properties run ``APCSIM_FUZZ_EXAMPLES`` examples each (default
2,000: what CI runs), the raw-bytes and ``--set`` ones a quarter as many; set it higher for a
longer local run. Examples are derandomized (the same ones every run) and not stored.
"""

from __future__ import annotations

import atexit
import copy
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.experiment.config import ConfigError, load_config
from sim.experiment.engine_description import resolve
from workloads.trace_format import TraceFormatError, TraceRequest, read_trace

EXAMPLES = int(os.environ.get("APCSIM_FUZZ_EXAMPLES", "2000"))
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=_HEALTH)
"""The two main properties (trace lines, config files): ``EXAMPLES`` each."""
FUZZ_AUX = settings(FUZZ, max_examples=max(1, EXAMPLES // 4))
"""The narrower ones (raw bytes, ``--set`` values): a quarter as many."""
_TMP = Path(tempfile.mkdtemp(prefix="apcsim-fuzz-"))  # one folder for every example, removed at exit
atexit.register(shutil.rmtree, _TMP, True)

# -- values ------------------------------------------------------------------------------------

HUGE = st.sampled_from([2**24, 2**31, 2**53 + 1, 2**62, 2**63, 2**64, 10**30, -(2**63) - 1, 10**400])
NON_FINITE = st.sampled_from([math.inf, -math.inf, math.nan])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5000), HUGE, st.floats(allow_nan=True, allow_infinity=True),
    NON_FINITE, st.text(max_size=12),
)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=4)


# -- trace lines -------------------------------------------------------------------------------

TRACE_FIELDS = ("id", "arrival", "tokens", "output_tokens", "output_token_ids", "salt", "lora", "priority",
                "prompt_logprobs", "tenant", "session", "system_tokens")


@st.composite
def trace_record(draw: Any, index: int) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": draw(st.one_of(st.just(f"r{index}"), st.integers(0, 10**6))),
        "arrival": float(index) + draw(st.floats(0, 0.9)),
        "tokens": draw(st.lists(st.integers(0, 2**20), min_size=1, max_size=6)),
        "output_tokens": draw(st.integers(1, 50)),
    }
    if draw(st.booleans()):
        rec["salt"] = draw(st.one_of(st.none(), st.text(max_size=5)))
    for _ in range(draw(st.integers(0, 3))):  # mutations
        kind = draw(st.sampled_from(["swap", "delete", "unknown", "huge", "non_finite", "token"]))
        field = draw(st.sampled_from(TRACE_FIELDS))
        if kind == "swap":
            rec[field] = draw(JSON_VALUES)
        elif kind == "delete":
            rec.pop(field, None)
        elif kind == "unknown":
            rec[draw(st.text(min_size=1, max_size=8))] = draw(SCALARS)
        elif kind == "huge":
            rec[field] = draw(HUGE)
        elif kind == "non_finite":
            rec[field] = draw(NON_FINITE)
        elif isinstance(rec.get("tokens"), list) and rec["tokens"]:
            rec["tokens"][draw(st.integers(0, len(rec["tokens"]) - 1))] = draw(SCALARS)
    return rec


@st.composite
def trace_text(draw: Any) -> str:
    lines = []
    for i in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["record", "record", "record", "truncated", "text", "blank", "array"]))
        if how == "text":
            lines.append(draw(st.text(max_size=40)).replace("\n", " ").replace("\r", " "))
        elif how == "blank":
            lines.append("")
        elif how == "array":
            lines.append(json.dumps(draw(JSON_VALUES)))
        else:
            line = json.dumps(draw(trace_record(i)))  # NaN / Infinity literals for non-finite floats
            if how == "truncated":
                line = line[: draw(st.integers(0, max(0, len(line) - 1)))]
            lines.append(line)
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


def _nonblank_lines(text: str) -> list[int]:
    # blank: JSON whitespace only (RFC 8259); a line of other control bytes (\x0b, \x1c) is malformed
    return [i for i, ln in enumerate(text.split("\n"), start=1) if ln.strip(" \t\r")]


def _check_request(r: TraceRequest) -> None:
    assert isinstance(r.id, str) and r.id
    assert math.isfinite(r.arrival) and r.arrival >= 0
    assert isinstance(r.output_tokens, int) and r.output_tokens >= 1
    assert len(r.tokens) >= 1


def _check_trace(path: Path, text: str, skip: bool) -> None:
    lines = _nonblank_lines(text)
    try:
        reader = read_trace(path, skip_bad_lines=skip)
        got = list(reader)
    except TraceFormatError as exc:
        # a trace with no request is an error of the whole file: an empty one always, one whose
        # every line was skipped unless allow_empty (then it replays nothing)
        if exc.field is None and "empty trace" in exc.problem:
            assert not lines and str(exc).startswith(f"{path}:1: "), str(exc)
            return
        if exc.field is None and "every line was skipped" in exc.problem:
            assert skip and exc.line in lines and str(exc).startswith(f"{path}:{exc.line}: "), str(exc)
            assert list(read_trace(path, skip_bad_lines=True, allow_empty=True)) == []
            return
        assert not skip, f"skip_bad_lines raised {exc}"
        assert exc.path == str(path) and exc.line in lines, str(exc)
        assert str(exc).startswith(f"{path}:{exc.line}: "), str(exc)
        return
    for r in got:
        _check_request(r)
    if skip:
        assert len(got) + reader.skipped == len(lines)


@FUZZ
@given(text=trace_text(), skip=st.booleans())
def test_fuzzed_trace_lines_give_a_result_or_a_trace_format_error(text, skip):
    path = _TMP / "fuzz.jsonl"
    path.write_text(text, encoding="utf-8")
    _check_trace(path, text, skip)


@FUZZ_AUX
@given(data=st.binary(max_size=200), skip=st.booleans())
def test_fuzzed_trace_bytes_give_a_result_or_a_trace_format_error(data, skip):
    path = _TMP / "fuzz_bytes.jsonl"
    path.write_bytes(data)
    _check_trace(path, data.decode("utf-8", "replace"), skip)


# -- configs -----------------------------------------------------------------------------------

BASE_CONFIG: dict[str, Any] = {
    "name": "fuzz",
    "seed": 0,
    "model": "llama-3-8b",
    "gpu": "H100-SXM",
    "engine": {"block_size": 16, "kv_cache_gib": 4.0, "max_num_batched_tokens": 8192, "max_num_seqs": 256,
               "max_model_len": 8192, "watermark": 0.0, "policy": "fcfs", "enable_chunked_prefill": True},
    "latency": {"kind": "fixed", "step_time_s": 0.01},
    "workload": {"kind": "chat", "sessions": 20, "arrival": {"kind": "poisson", "rate": 2.0},
                 "tenants": {"num_tenants": 2, "salt": "per_tenant"}},
    "replay": {"fast_forward": True, "tables": ["parquet"], "on_invalid_request": "reject"},
}


def _leaf_paths(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(data, dict):
        out = [prefix] if prefix else []
        for k, v in data.items():
            out.extend(_leaf_paths(v, (*prefix, k)))
        return out
    return [prefix]


PATHS = _leaf_paths(BASE_CONFIG)


def _set(data: dict, path: tuple[str, ...], value: Any) -> None:
    node = data
    for p in path[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[path[-1]] = value


@st.composite
def config_text(draw: Any) -> str:
    data = copy.deepcopy(BASE_CONFIG)
    for _ in range(draw(st.integers(0, 4))):
        path = draw(st.sampled_from(PATHS))
        kind = draw(st.sampled_from(["swap", "swap", "delete", "unknown", "huge", "non_finite"]))
        if kind == "delete":
            node = data
            for p in path[:-1]:
                node = node.get(p) if isinstance(node.get(p), dict) else {}
            node.pop(path[-1], None)
        elif kind == "unknown":
            _set(data, (*path[:-1], draw(st.text(min_size=1, max_size=8))), draw(SCALARS))
        else:
            value = draw({"swap": JSON_VALUES, "huge": HUGE, "non_finite": NON_FINITE}[kind])
            _set(data, path, value)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    how = draw(st.sampled_from(["plain", "plain", "duplicate", "truncated", "garbage"]))
    lines = text.splitlines(keepends=True)
    if how == "duplicate":
        i = draw(st.integers(0, len(lines) - 1))
        lines.insert(draw(st.integers(i + 1, len(lines))), lines[i])
    elif how == "truncated":
        text = "".join(lines)
        return text[: draw(st.integers(0, len(text)))]
    elif how == "garbage":
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=20)) + "\n")
    return "".join(lines)


_WHERE = r"(:\d+(:\d+)?: |: )"


def _check_config(path: Path, overrides: list[str] | None = None) -> None:
    try:
        cfg = load_config(path, overrides)
        resolve(cfg)
    except ConfigError as exc:
        msg = str(exc)
        for line in msg.splitlines():
            assert re.match(re.escape(str(path)) + _WHERE + r"\S", line) or line.startswith("--set "), msg


@FUZZ
@given(text=config_text())
def test_fuzzed_configs_give_a_config_or_a_config_error(text):
    path = _TMP / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    _check_config(path)


@FUZZ_AUX
@given(data=st.binary(max_size=120), keep=st.integers(0, 400))
def test_fuzzed_config_bytes_give_a_config_error_naming_the_file(data, keep):
    path = _TMP / "fuzz_bytes.yaml"
    path.write_bytes(yaml.safe_dump(BASE_CONFIG).encode()[:keep] + data)
    _check_config(path)


@FUZZ_AUX
@given(key=st.one_of(st.sampled_from([".".join(p) for p in PATHS]), st.text(max_size=15)),
       value=st.one_of(st.text(max_size=15), JSON_VALUES.map(lambda v: json.dumps(v))))
def test_fuzzed_set_overrides_name_the_override(key, value):
    path = _TMP / "fuzz_base.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(BASE_CONFIG))
    _check_config(path, [f"{key}={value}"])


# -- trace parser edge cases -------------------------------------------------------------------


def test_integer_arrival_beyond_float_range_is_refused(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"id": "a", "arrival": 1' + "0" * 400 + ', "tokens": [1, 2], "output_tokens": 2}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: field 'arrival'"):
        list(read_trace(p))
