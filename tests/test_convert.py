"""apcsim convert: chat logs, ShareGPT and vllm-bench files to the canonical trace, with a tokenizer
trained here and a Llama-3-style chat template (tests/convert_tokenizer.py); the template
environment of transformers' apply_chat_template; timestamps; the header; the replay of a
converted trace (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from convert_tokenizer import make_model_folder

from sim.cli.main import main
from sim.core.request import token_array
from sim.experiment.config import ConfigError, config_from_dict, load_config
from sim.experiment.run import replay_experiment
from workloads.convert.chat_template import ChatTemplate, TemplateRenderError
from workloads.convert.tokenizer import load_tokenizer
from workloads.convert.writer import ConvertOptions, convert
from workloads.trace_format import read_trace


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("model"))


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _convert(src: Path, model: Path | str, fmt: str = "openai", **kw) -> tuple[list, dict]:
    out = src.with_suffix(".trace.jsonl")
    convert(src, out, ConvertOptions(format=fmt, tokenizer=str(model), progress=False, **kw))
    reader = read_trace(out)
    reqs = list(reader)
    return reqs, reader.header


CHAT = {
    "id": "c1", "user": "alice", "created": "2026-12-07T12:00:00Z",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hello cache"},
        {"role": "assistant", "content": "The prefix is hot."},
        {"role": "user", "content": [{"type": "text", "text": "Why "}, {"type": "text", "text": "so?"}]},
    ],
    "response": {"choices": [{"message": {"role": "assistant", "content": "Because of hits."}}],
                 "usage": {"completion_tokens": 9}},
}


def test_llama3_style_template_renders_as_apply_chat_template(model):
    """trim_blocks/lstrip_blocks drop the template's own newlines, content is trimmed, the
    generation prompt is added, bos_token comes from tokenizer_config.json."""
    tok = load_tokenizer(str(model))
    text = tok.template.render(CHAT["messages"][:2], add_generation_prompt=True)
    assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHello cache<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_template_environment_has_transformers_globals_and_filters():
    t = ChatTemplate({"default": "{{ messages | tojson }}|{{ strftime_now('%Y') | length }}"
                                 "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                                 "[{{ m.content }}]{% endfor %}"})
    out = t.render([{"role": "user", "content": "héllo"}, {"role": "user", "content": "x"}],
                   add_generation_prompt=False)
    assert out.startswith('[{"role": "user", "content": "héllo"}')  # tojson keeps non-ASCII
    assert out.endswith("|4[héllo]") and t.uses_clock  # strftime_now, loopcontrols' break


def test_raise_exception_reports_the_template_line():
    t = ChatTemplate({"default": "{% for m in messages %}\n{% if m.role == 'tool' %}\n"
                                 "{{ raise_exception('no tools here') }}\n{% endif %}{% endfor %}"})
    with pytest.raises(TemplateRenderError) as err:
        t.render([{"role": "tool", "content": ""}], add_generation_prompt=True)
    assert err.value.template_line == 3 and err.value.message == "no tools here"


def test_openai_multi_turn_is_one_request_per_turn(tmp_path, model):
    reqs, header = _convert(_jsonl(tmp_path / "log.jsonl", [CHAT]), model)
    tok = load_tokenizer(str(model))
    assert [r.id for r in reqs] == ["c1-t1", "c1-t2"]
    assert [r.session for r in reqs] == ["c1", "c1"] and reqs[0].tenant == "alice"  # user -> tenant
    assert [r.arrival for r in reqs] == [0.0, 10.0]  # the record's time is its last turn's; 10 s gap
    p1 = tok.template.render(CHAT["messages"][:2], add_generation_prompt=True)
    assert token_array(reqs[0].tokens).tolist() == tok.encode_batch([p1])[0]
    answer = tok.encode_batch(["The prefix is hot.<|eot_id|>"])[0]  # what the model generated, stop token too
    assert reqs[0].output_token_ids.tolist() == answer and reqs[0].output_tokens == len(answer)
    second = token_array(reqs[1].tokens).tolist()
    assert second[: len(p1_ids := tok.encode_batch([p1])[0]) + len(answer)] == p1_ids + answer
    assert reqs[1].output_tokens == 9  # usage.completion_tokens wins over the text's length
    text_ids = tok.encode_batch(["Because of hits."])[0]
    assert (reqs[1].output_token_ids is None) == (len(text_ids) < 9)  # ids kept only when they cover the count
    assert header["format"] == "openai" and header["approximate"] is False and header["requests"] == 2


def test_turns_last_and_first(tmp_path, model):
    log = _jsonl(tmp_path / "log.jsonl", [CHAT])
    last, _ = _convert(log, model, turns="last")
    first, _ = _convert(log, model, turns="first")
    assert [r.id for r in last] == ["c1"] and last[0].output_tokens == 9
    assert [r.id for r in first] == ["c1"] and first[0].output_token_ids is not None


def test_timestamps_iso_seconds_milliseconds_and_sorting(tmp_path, model):
    base = {"messages": [{"role": "user", "content": "hi"}], "usage": {"completion_tokens": 2}}
    recs = [{**base, "created": 1765000002.5}, {**base, "timestamp": 1765000001000}, {**base, "created": 1765000003}]
    reqs, header = _convert(_jsonl(tmp_path / "t.jsonl", recs), model)
    assert [r.id for r in reqs] == ["line2", "line1", "line3"]  # sorted by arrival, ms read as ms
    assert [r.arrival for r in reqs] == [0.0, 1.5, 2.0] and header["reordered"] is True
    iso = [{**base, "created": "2026-12-07T12:00:00+01:00"}, {**base, "created": "2026-12-07 11:00:01"}]
    assert [r.arrival for r in _convert(_jsonl(tmp_path / "i.jsonl", iso), model)[0]] == [0.0, 1.0]


def test_no_timestamps_need_an_arrival_process(tmp_path, model):
    recs = [{"messages": [{"role": "user", "content": f"hi {i}"}], "usage": {"completion_tokens": 2}}
            for i in range(4)]
    out = tmp_path / "n.trace.jsonl"
    convert(_jsonl(tmp_path / "n.jsonl", recs), out, ConvertOptions(format="openai", tokenizer=str(model)))
    assert json.loads(out.read_text().splitlines()[0])["apcsim_trace"]["timestamps"] == "none"
    engine = {"block_size": 16, "num_gpu_blocks": 64, "max_model_len": 256}
    cfg = config_from_dict({"name": "n", "engine": engine, "workload": {"kind": "trace", "path": str(out)}})
    with pytest.raises(ConfigError, match="no timestamps.*set workload.arrival"):
        replay_experiment(cfg, progress=False)
    cfg = config_from_dict({"name": "n", "engine": engine, "workload": {
        "kind": "trace", "path": str(out), "arrival": {"kind": "poisson", "rate": 5}}})
    res, wl = replay_experiment(cfg, progress=False)
    assert len(res.requests) == 4 and "(no timestamps)" in wl.description and "poisson arrivals" in wl.description


def test_sharegpt_as_vllm_bench_reads_it(tmp_path, model):
    data = [{"id": "a", "conversations": [{"from": "human", "value": "Hello there"},
                                          {"from": "gpt", "value": "Hi, what is the cache?"},
                                          {"from": "human", "value": "A prefix store"},
                                          {"from": "gpt", "value": "Thanks"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "One question"}]}]
    src = tmp_path / "sg.json"
    src.write_text(json.dumps(data, indent=1))
    reqs, header = _convert(src, model, "sharegpt")
    assert [r.id for r in reqs] == ["a-t1", "a-t2", "b"] and header["timestamps"] == "none"
    assert reqs[2].output_tokens == 256  # no answer: --default-output-tokens
    assert header["default_output_requests"] == 1


def test_vllm_bench_custom_with_and_without_template(tmp_path, model):
    src = _jsonl(tmp_path / "b.jsonl", [{"prompt": "Tell me about caches", "output_tokens": 7}, {"prompt": "Hi"}])
    tok = load_tokenizer(str(model))
    plain, _ = _convert(src, model, "vllm-bench", chat_template=False)
    assert token_array(plain[0].tokens).tolist() == tok.encode_batch(["Tell me about caches"])[0]
    assert [r.output_tokens for r in plain] == [7, 256]
    templated, _ = _convert(src, model, "vllm-bench")
    assert token_array(templated[0].tokens).tolist() == tok.encode_batch(
        [tok.template.render([{"role": "user", "content": "Tell me about caches"}], add_generation_prompt=True)])[0]


def test_trace_labels_are_kept(tmp_path, model):
    rec = {"messages": [{"role": "user", "content": "hi"}], "usage": {"completion_tokens": 3},
           "tenant": "acme", "session": "s9", "cache_salt": "k1", "lora": "sql-adapter"}
    (req,), _ = _convert(_jsonl(tmp_path / "l.jsonl", [rec]), model)
    assert (req.tenant, req.session, req.salt, req.lora) == ("acme", "s9", "k1", "sql-adapter")


def test_approx_tokenizer_is_marked_in_the_trace_and_the_replay(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", [{"messages": [{"role": "user", "content": "héllo"}], "created": 1,
                                         "usage": {"completion_tokens": 2}}])
    reqs, header = _convert(src, "approx")
    assert header["approximate"] is True
    assert token_array(reqs[0].tokens).tolist() == list("<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>"
                                                        "assistant\n".encode())
    cfg = config_from_dict({"name": "a", "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_model_len": 256},
                            "workload": {"kind": "trace", "path": str(src.with_suffix(".trace.jsonl"))}})
    _, wl = replay_experiment(cfg, progress=False)
    assert "APPROXIMATE" in wl.description and any("APPROXIMATE" in n for n in wl.notes)


def test_cli_convert_prints_a_summary(tmp_path, model, capsys):
    src = _jsonl(tmp_path / "c.jsonl", [CHAT])
    out = tmp_path / "o.jsonl"
    assert main(["convert", str(src), "--format", "openai", "--tokenizer", str(model), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 records" in text and "2 requests" in text and "fingerprint" in text
    assert np.asarray(json.loads(out.read_text().splitlines()[1])["tokens"]).size > 0


def test_bundled_openai_example_replays_with_its_config(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "my_chat_log.trace.jsonl"
    convert(root / "workloads/data/examples/openai_chat.jsonl", out,
            ConvertOptions(format="openai", tokenizer="approx", progress=False))
    assert out.read_text() == (root / "configs/traces/my_chat_log.jsonl").read_text()  # the bundled conversion
    cfg = load_config(root / "configs/my_chat_log.yaml")
    res, wl = replay_experiment(cfg, progress=False)
    assert len(res.requests) == 6 and res.requests["hit_tokens"].sum() > 0 and "APPROXIMATE" in wl.description


def test_trace_tenants_and_salts_win_over_drawn_ones(tmp_path, model):
    """tenants.salt applies to the trace's own tenant labels; a request's own salt is kept;
    assign_by: random draws every request as before (issue 35 item 3)."""
    from workloads.registry import build_workload
    from workloads.schema import TraceWorkload

    recs = [{"messages": [{"role": "user", "content": f"q{i}"}], "usage": {"completion_tokens": 2}, "created": i,
             "user": user} for i, user in enumerate(["acme", "globex", "acme", None])]
    recs[2]["cache_salt"] = "own"
    out = tmp_path / "t.trace.jsonl"
    convert(_jsonl(tmp_path / "t.jsonl", recs), out, ConvertOptions(format="openai", tokenizer=str(model)))

    def labels(**tenants):
        w = TraceWorkload(kind="trace", path=str(out), tenants=tenants)
        return [(r.tenant, r.salt) for r in build_workload(w, seed=0).requests]

    got = labels(num_tenants=2, salt="per_tenant")
    assert got[:3] == [("acme", "acme"), ("globex", "globex"), ("acme", "own")]
    assert got[3][0] in ("t0", "t1") and got[3][1] == got[3][0]  # no label: drawn, as before
    drawn = labels(num_tenants=2, salt="per_tenant", assign_by="random")
    assert {t for t, _ in drawn} <= {"t0", "t1"} and all(s == t for t, s in drawn)


def test_workers_give_the_same_trace(tmp_path, model):
    """--workers: batches converted in other processes, results in input order: the same bytes,
    rejected lines included."""
    recs = [{**CHAT, "id": f"c{i}", "created": 1000 + i} for i in range(30)]
    recs[7] = {"messages": [{"content": "no role"}]}
    src = _jsonl(tmp_path / "w.jsonl", recs)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}.jsonl"
        convert(src, out, ConvertOptions(format="openai", tokenizer=str(model), skip_bad_lines=True, batch=4,
                                         workers=workers))
        outs.append(out.read_text())
    assert outs[0] == outs[1] and json.loads(outs[0].splitlines()[0])["apcsim_trace"]["rejected_line_numbers"] == [8]
    from workloads.convert.writer import auto_workers

    assert auto_workers(src) == 1  # a small input converts in this process (starting workers costs more)


def test_every_format_example_of_the_docs_page_converts(tmp_path):
    """docs/convert.md's three-line example of each format, in its order, converts as shown."""
    import re

    doc = (Path(__file__).resolve().parents[1] / "docs" / "convert.md").read_text()
    fences = re.findall(r"^```(\w*)\n(.*?)^```$", doc, re.S | re.M)  # in order: a block's closing fence is no opening
    blocks = [b for lang, b in fences if not lang and b.lstrip().startswith(("{", "["))]
    formats = ["openai", "sharegpt", "vllm-bench", "mooncake", "bailian"]
    assert len(blocks) == len(formats)
    for fmt, block in zip(formats, blocks, strict=True):
        src = tmp_path / f"{fmt}.txt"
        src.write_text(block)
        s = convert(src, tmp_path / f"{fmt}.out.jsonl", ConvertOptions(format=fmt, tokenizer="approx"))
        assert s.records == (2 if fmt == "sharegpt" else 3) and s.rejected_lines == 0


def test_a_repeated_record_id_is_named_apart(tmp_path, model):
    """Two records with one id: the second request keeps its place, named ``id#index`` (its index
    among the spooled requests), escapes kept."""
    recs = [{"id": 'c"1', "messages": [{"role": "user", "content": f"q{i}"}], "usage": {"completion_tokens": 2},
             "created": 100 + i} for i in range(3)]
    reqs, _ = _convert(_jsonl(tmp_path / "r.jsonl", recs), model)
    assert [r.id for r in reqs] == ['c"1', 'c"1#1', 'c"1#2']
