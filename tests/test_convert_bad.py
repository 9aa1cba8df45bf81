"""Bad input to apcsim convert: one line naming the file, line and field, exit code 2, never a
traceback; with --skip-bad-lines the bad record is rejected alone and counted in the header and
the summary (issue 35, "Bad input")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from convert_tokenizer import LLAMA3_STYLE_TEMPLATE, make_model_folder

from sim.cli.main import main

OK = {"messages": [{"role": "user", "content": "hello"}], "usage": {"completion_tokens": 3}, "created": 5}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("model"))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(capsys, *argv: str) -> str:
    rc, _, err = _run(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _log(tmp_path: Path, *records) -> str:
    path = tmp_path / "log.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize(("record", "where"), [
    ({"messages": [{"content": "hi"}]}, "log.jsonl:2: field 'messages[0].role': missing"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]},
     "log.jsonl:2: field 'messages[0].content[0].type': unknown content part type 'video'"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "log.jsonl:2: field 'messages[0].role': unknown role"),
    ({"messages": [{"role": "user", "content": "hi"}], "usage": {"completion_tokens": 0}},
     "log.jsonl:2: field 'usage.completion_tokens': expected an int >= 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "created": "yesterday"},
     "log.jsonl:2: field 'created': not an ISO-8601 time"),
    ({"messages": [{"role": "user", "content": "hi"}]},
     "log.jsonl:2: field 'timestamp': missing, while earlier records have one"),
    ("{oops", "log.jsonl:2: malformed JSON"),
])
def test_a_bad_record_is_one_line_naming_file_line_field(tmp_path, model, capsys, record, where):
    err = _one_line_error(capsys, "convert", _log(tmp_path, OK, record), "--format", "openai", "--tokenizer",
                          str(model), "--out", str(tmp_path / "o.jsonl"))
    assert where in err
    assert not (tmp_path / "o.jsonl").exists() and not list(tmp_path.glob("*.part"))  # nothing half-written


def test_a_tokenizer_file_that_is_not_a_tokenizer(tmp_path, capsys):
    for name, text, want in (("t1.json", '{"model": {"type": "BPE", "vocab": 3}}', "t1.json:1: not a tokenizer"),
                             ("t2.json", '{"version": "1.0",\n "model": ', "t2.json:2: the tokenizer file is not JSON"),
                             ("t3.json", '["a list"]', "t3.json:1: not a Hugging Face tokenizer.json")):
        (tmp_path / name).write_text(text)
        err = _one_line_error(capsys, "convert", _log(tmp_path, OK), "--format", "openai", "--tokenizer",
                              str(tmp_path / name), "--out", str(tmp_path / "o.jsonl"))
        assert want in err


def test_no_tokenizer_says_how_to_get_one(tmp_path, capsys):
    err = _one_line_error(capsys, "convert", _log(tmp_path, OK), "--format", "openai", "--out",
                          str(tmp_path / "o.jsonl"))
    assert "no tokenizer" in err and "model folder" in err and "--tokenizer approx" in err


def test_a_chat_template_that_fails_to_render_shows_its_line(tmp_path, model, capsys):
    bad = tmp_path / "bad_model"
    bad.mkdir()
    (bad / "tokenizer.json").write_text((model / "tokenizer.json").read_text())
    template = LLAMA3_STYLE_TEMPLATE.replace("{%- for message in messages %}",
                                             "{%- for message in messages %}\n{{- message.missing.key }}")
    (bad / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                           "chat_template": template}))
    err = _one_line_error(capsys, "convert", _log(tmp_path, OK), "--format", "openai", "--tokenizer", str(bad),
                          "--out", str(tmp_path / "o.jsonl"))
    line = template.splitlines().index("{{- message.missing.key }}") + 1
    assert f"log.jsonl:1: field 'messages': chat template fails to render (template line {line})" in err
    (bad / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    err = _one_line_error(capsys, "convert", _log(tmp_path, OK), "--format", "openai", "--tokenizer", str(bad),
                          "--out", str(tmp_path / "o.jsonl"))
    assert "tokenizer_config.json:1: field 'chat_template': template 'default' does not compile" in err


def test_sharegpt_given_as_jsonl_and_the_reverse(tmp_path, model, capsys):
    jsonl = _log(tmp_path, OK)
    err = _one_line_error(capsys, "convert", jsonl, "--format", "sharegpt", "--tokenizer", str(model),
                          "--out", str(tmp_path / "o.jsonl"))
    assert "log.jsonl:1:" in err and "JSONL" in err and "--format openai" in err
    sg = tmp_path / "sg.json"
    sg.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}]))
    for fmt in ("openai", "vllm-bench"):
        err = _one_line_error(capsys, "convert", str(sg), "--format", fmt, "--tokenizer", str(model),
                              "--out", str(tmp_path / "o.jsonl"))
        assert "sg.json:1:" in err and "--format sharegpt" in err


def test_sharegpt_bad_element_names_its_line(tmp_path, model, capsys):
    sg = tmp_path / "sg.json"
    sg.write_text('[\n {"conversations": [{"from": "human", "value": "hi"}]},\n'
                  ' {"conversations": [{"from": "alien", "value": "hi"}]}\n]\n')
    err = _one_line_error(capsys, "convert", str(sg), "--format", "sharegpt", "--tokenizer", str(model),
                          "--out", str(tmp_path / "o.jsonl"))
    assert "sg.json:3: field 'conversations[0].from': unknown speaker 'alien'" in err


def test_bailian_hash_ids_not_matching_input_length(tmp_path, capsys):
    path = tmp_path / "bl.jsonl"
    path.write_text(json.dumps({"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40,
                                "output_length": 3, "type": "text", "turn": 1, "hash_ids": [1, 2]}) + "\n")
    err = _one_line_error(capsys, "convert", str(path), "--format", "bailian", "--out", str(tmp_path / "o.jsonl"))
    assert "bl.jsonl:1: field 'hash_ids': 2 ids for input_length 40: expected ceil(40 / 16) = 3" in err


def test_skip_bad_lines_counts_rejected_lines_in_header_and_summary(tmp_path, model, capsys):
    src = _log(tmp_path, OK, {"messages": [{"content": "x"}]}, "{oops", {**OK, "created": 9})
    out = tmp_path / "o.jsonl"
    rc, text, _ = _run(capsys, "convert", src, "--format", "openai", "--tokenizer", str(model), "--out", str(out),
                       "--skip-bad-lines")
    assert rc == 0 and "rejected    2 lines (lines 2, 3)" in text and "messages[0].role" in text
    header = json.loads(out.read_text().splitlines()[0])["apcsim_trace"]
    assert header["rejected_lines"] == 2 and header["rejected_line_numbers"] == [2, 3] and header["requests"] == 2


def test_every_record_rejected_is_an_error(tmp_path, model, capsys):
    err = _one_line_error(capsys, "convert", _log(tmp_path, {"messages": []}), "--format", "openai", "--tokenizer",
                          str(model), "--out", str(tmp_path / "o.jsonl"), "--skip-bad-lines")
    assert "log.jsonl:1: no request converted (every record rejected" in err
