"""A record decoded through msgspec (``workloads.convert.json_record.decode_record``) equals the
strict decoder's (``workloads.trace_json.decode_line``): same values and types (floats keep their
text), the same ``FieldProblem`` for a line the strict decoder refuses -- repeated keys at any depth,
spaced colons, ``":`` inside strings, NaN, lone surrogates, a BOM, bad UTF-8, huge numbers -- and the
compiled checks (``word_scan.key_marks`` / ``count_keys``) equal their definitions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.convert import json_record
from workloads.convert.json_record import count_keys, decode_record, key_marks
from workloads.trace_json import FieldProblem, decode_line

_key = st.sampled_from(["a", "b", "a:", '"', 'x":', "é", "\\", " ", ""])
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(['":', '" :', "\ud800", "ü", "\\"]))
_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.lists(st.tuples(_key, inner), max_size=3)), max_leaves=12)


def _text(value: Any, sep: tuple[str, str]) -> str:
    """JSON text of ``value``, where a list of (key, value) pairs is an object written as is
    (repeated keys kept)."""
    if isinstance(value, list) and value and all(isinstance(p, tuple) for p in value):
        return "{" + sep[0].join(json.dumps(k) + sep[1] + _text(v, sep) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + sep[0].join(_text(v, sep) for v in value) + "]"
    return json.dumps(value)


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return ("dict", [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_shape(v) for v in value])
    return (type(value).__name__, repr(value), getattr(value, "text", None))


def _outcome(decode: Any, raw: bytes) -> Any:
    try:
        return _shape(decode(raw))
    except FieldProblem as exc:
        return ("problem", exc.field, exc.problem)


_SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (",", " : "), (" ,", ":\t"), (",", ":\n")])


@settings(max_examples=500, deadline=None)
@given(_value, _SEPARATORS, st.sampled_from([b"", b"\xef\xbb\xbf", b" ", b"\xff"]),
       st.sampled_from([b"", b"\n", b" x"]))
def test_decode_record_equals_the_strict_decoder(value: Any, sep: tuple[str, str], before: bytes,
                                                 after: bytes) -> None:
    text = _text(value, sep)
    for raw in (text.encode("utf-8", "surrogatepass"), before + text.encode("utf-8", "surrogatepass") + after):
        assert _outcome(decode_record, raw) == _outcome(decode_line, raw)


def test_repeated_keys_are_refused_as_before() -> None:
    for raw in (b'{"a":1,"a":2}', b'{"m":[{"role":"user","role":"x"}]}', b'{"a":{"b":1},"c":{"b":2,"b":3}}',
                b'{"a":"\\":","a":1}'):
        assert _outcome(decode_record, raw)[0] == "problem"
        assert _outcome(decode_record, raw) == _outcome(decode_line, raw)
    assert decode_record(b'{"a":"x\\":y","b":1}') == {"a": 'x":y', "b": 1}  # a ": in a string: strict path, same


@settings(max_examples=300, deadline=None)
@given(_value, _SEPARATORS)
def test_the_compiled_checks_equal_their_definitions(value: Any, sep: tuple[str, str]) -> None:
    word_scan = pytest.importorskip("workloads.convert.word_scan")
    raw = _text(value, sep).encode("utf-8", "surrogatepass")
    assert word_scan.key_marks(raw) == key_marks(raw)
    try:
        decoded = decode_line(raw)
    except FieldProblem:
        return
    assert word_scan.count_keys(decoded) == count_keys(decoded)


def test_count_keys_gives_up_past_its_depth() -> None:
    deep: Any = {"a": 1}
    for _ in range(json_record.MAX_DEPTH + 5):
        deep = [deep]
    assert count_keys(deep) == -1
    word_scan = pytest.importorskip("workloads.convert.word_scan")
    assert word_scan.count_keys(deep) == -1
    assert count_keys([[{"a": 1, "b": {"c": []}}], {}]) == 3


def test_without_msgspec_every_line_is_decoded_strictly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_record, "_FAST", None)
    assert decode_record(b'{"a":1.50}') == {"a": 1.5}
    assert decode_record(b'{"a":1.50}')["a"].text == "1.50"
    assert _outcome(decode_record, b'{"a":1,"a":2}') == _outcome(decode_line, b'{"a":1,"a":2}')


def test_a_plain_record_is_taken_from_msgspec(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("msgspec")

    def strict(raw: bytes) -> Any:
        raise AssertionError("the strict decoder ran")

    monkeypatch.setattr(json_record, "decode_line", strict)
    got = decode_record(b'{"messages": [{"role": "user", "content": "a: b"}], "created": 1765000000.050}')
    assert got == {"messages": [{"role": "user", "content": "a: b"}], "created": 1765000000.05}
    assert got["created"].text == "1765000000.050"
