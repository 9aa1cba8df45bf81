"""The fast serialization of ``apcsim convert`` (pieces' ids kept as JSON text, the segment cache
per message) writes exactly the bytes of the former path (ids as lists and arrays, each request
serialized by ``request_to_json``: ``ConvertOptions(reference=True)``), for random chat logs:
multi-turn records, logs resending the history on every line, labels with quotes and non-ASCII
text, tools, answers as text or counts, bad records skipped, every turn mode, both tokenizers."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from convert_tokenizer import shared_model_folder, shared_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.convert import tokenizer as tokenizer_module
from workloads.convert.tokenizer import load_tokenizer
from workloads.convert.writer import ConvertOptions, convert

_TMP = tempfile.TemporaryDirectory(prefix="apcsim-convert-speed-")

_model, _tokenizer = shared_model_folder, shared_tokenizer


_words = st.sampled_from(["the", "cache", "prefix", " ", "  ", "\n", "héllo", "token?", "<|eot_id|>", "x", "42",
                          "Hit", "miss.", "\t", "ü", "<|start_header_id|>", "\"q\"", "\\", "😀"])
_text = st.lists(_words, min_size=0, max_size=10).map("".join)
_label = st.one_of(st.none(), st.text(st.sampled_from('ab"\\é😀 '), min_size=1, max_size=4), st.integers(0, 9))
_tools = st.one_of(st.none(), st.just([{"type": "function", "function": {"name": "f", "parameters": {}}}]))


@st.composite
def chat_logs(draw: st.DrawFn) -> list[dict[str, object]]:
    """Records: independent chats, or one conversation resent with its history line by line."""
    records: list[dict[str, object]] = []
    history: list[dict[str, str]] = [{"role": "system", "content": draw(_text)}]
    for i in range(draw(st.integers(1, 5))):
        if not draw(st.booleans()):  # a new conversation
            history = [{"role": "system", "content": draw(_text)}] if draw(st.booleans()) else []
        history = history + [{"role": "user", "content": draw(_text)}]
        rec: dict[str, object] = {"messages": history, "created": 1000 + i * draw(st.sampled_from([0, 1, 7]))}
        for key in ("id", "user", "tenant", "session", "salt", "lora"):
            value = draw(_label)
            if value is not None:
                rec[key] = value
        if (tools := draw(_tools)) is not None:
            rec["tools"] = tools
        answer = draw(_text)
        usage = draw(st.one_of(st.none(), st.integers(0, 30)))  # 0: a bad record (skipped)
        if draw(st.booleans()):
            rec["choices"] = [{"message": {"role": "assistant", "content": answer}}]
        if usage is not None:
            rec["usage"] = {"completion_tokens": usage}
        records.append(rec)
        history = history + [{"role": "assistant", "content": answer}]
    return records


@settings(max_examples=60, deadline=None)
@given(records=chat_logs(), turns=st.sampled_from(["all", "last", "first"]),
       tokenizer=st.sampled_from(["trained", "approx"]))
def test_fast_serialization_writes_the_reference_bytes(records, turns, tokenizer):
    folder = Path(tempfile.mkdtemp(dir=_TMP.name))
    src = folder / "log.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    spec = "approx" if tokenizer == "approx" else str(_model())
    outputs = []
    for reference in (True, False):
        out = folder / f"{reference}.jsonl"
        try:
            convert(src, out, ConvertOptions(format="openai", tokenizer=spec, turns=turns, skip_bad_lines=True,
                                             progress=False, batch=3, reference=reference))
            outputs.append(out.read_bytes())
        except Exception as exc:  # e.g. every record rejected: the same error both ways
            outputs.append(str(exc).encode())
    assert outputs[0] == outputs[1]


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(_text, min_size=1, max_size=8), tokenizer=st.sampled_from(["trained", "approx"]))
def test_encode_json_is_the_ids_joined(texts, tokenizer):
    tok = _tokenizer(tokenizer)
    for got, ids in zip(tok.encode_json(texts), tok.encode_batch(texts, cached=False), strict=True):
        assert got == (",".join(map(str, ids)), len(ids))


def test_encode_json_across_cache_resets(monkeypatch: pytest.MonkeyPatch):
    """A full cache is emptied (the added tokens kept) and refilled: the same ids and texts."""
    tok = load_tokenizer(str(_model()))
    monkeypatch.setattr(tokenizer_module, "CACHE_LIMIT", 8)
    texts = [f"<|start_header_id|>user<|end_header_id|>\n\nthe cache {i} hit<|eot_id|>" for i in range(30)]
    for chunk in (texts[:3], texts[3:20], texts, texts[::-1]):
        for got, ids in zip(tok.encode_json(chunk), tok.encode_batch(chunk, cached=False), strict=True):
            assert got == (",".join(map(str, ids)), len(ids))
        assert len(tok._cache) <= 8 + len(chunk) * 3


@settings(max_examples=40, deadline=None)
@given(records=chat_logs(), stamps=st.lists(st.booleans(), min_size=5, max_size=5), ids=st.booleans())
def test_a_batch_of_good_records_is_written_as_record_by_record(records, stamps, ids):
    """The writer takes a batch whose records are all good and timestamped alike in one spool call:
    the same bytes as batches of one record (walked one by one), with records that lack a timestamp
    among stamped ones (rejected), repeated record ids (renamed) and bad records mixed in."""
    for rec, stamped in zip(records, stamps):
        if not stamped:
            rec.pop("created", None)
        if ids:
            rec["id"] = "same"
    folder = Path(tempfile.mkdtemp(dir=_TMP.name))
    src = folder / "log.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    outputs = []
    for batch in (1, 2, 64):
        out = folder / f"{batch}.jsonl"
        try:
            convert(src, out, ConvertOptions(format="openai", tokenizer=str(_model()), skip_bad_lines=True,
                                             progress=False, batch=batch))
            outputs.append(out.read_bytes())
        except Exception as exc:  # e.g. every record rejected: the same error every way
            outputs.append(str(exc).encode())
    assert outputs[0] == outputs[1] == outputs[2]
