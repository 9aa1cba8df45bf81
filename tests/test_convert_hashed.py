"""Shareable hashed traces (apcsim anonymize) and the Qwen-Bailian reader (issue 35): the round trip
keeps every request's hit tokens and TTFT at the block size B and its multiples, finer or other
block sizes are refused, nothing of the tokens is written; Bailian sessions follow parent_chat_id
and ``workload: {kind: bailian}`` replays like Mooncake."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from convert_tokenizer import make_model_folder, sentence

from sim.cli.main import main
from sim.core.request import token_array
from sim.experiment.config import ConfigError, config_from_dict
from sim.experiment.run import replay_experiment
from workloads.bailian import load_bailian
from workloads.convert.writer import ConvertOptions, convert
from workloads.hashed_trace import anonymize
from workloads.trace_format import TraceFormatError, TraceRequest, read_trace, write_trace

EXAMPLES = Path(__file__).resolve().parents[1] / "workloads" / "data" / "examples"


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory) -> Path:
    """40 multi-turn chats sharing system prompts, tenants with salts and a LoRA, converted."""
    folder = tmp_path_factory.mktemp("hashed")
    model = make_model_folder(folder / "model")
    rng = random.Random(3)
    systems = [sentence(rng, 30) for _ in range(3)]
    lines = []
    for c in range(40):
        msgs = [{"role": "system", "content": rng.choice(systems)}]
        for _ in range(rng.randint(1, 3)):
            msgs += [{"role": "user", "content": sentence(rng, rng.randint(5, 50))},
                     {"role": "assistant", "content": sentence(rng, rng.randint(5, 50))}]
        msgs.pop()
        rec = {"messages": msgs, "usage": {"completion_tokens": rng.randint(3, 40)}, "created": 1000 + 2 * c,
               "user": f"u{c % 4}"}
        if c % 5 == 0:
            rec["cache_salt"] = "secret-tenant"
        if c % 7 == 0:
            rec["lora"] = "sql"
        lines.append(json.dumps(rec))
    (folder / "log.jsonl").write_text("\n".join(lines) + "\n")
    out = folder / "trace.jsonl"
    convert(folder / "log.jsonl", out, ConvertOptions(format="openai", tokenizer=str(model), turn_gap_s=1.0))
    return out


def _replay(path: Path, block_size: int, blocks: int = 120):
    cfg = config_from_dict({"name": "rt", "engine": {"block_size": block_size, "num_gpu_blocks": blocks,
                                                     "max_model_len": 1024},
                            "latency": {"kind": "fixed", "step_time_s": 0.01},
                            "workload": {"kind": "trace", "path": str(path)}})
    res, wl = replay_experiment(cfg, progress=False)
    return res.requests, wl


@pytest.mark.parametrize("multiple", [1, 2, 3])
def test_round_trip_same_hits_and_ttft_at_block_size_and_multiples(chat_trace, tmp_path, multiple):
    hashed = tmp_path / "h.jsonl"
    anonymize(chat_trace, hashed, block_size=16, secret="k3y")
    # a small pool: evictions and queueing happen, so TTFT depends on every hit
    original, _ = _replay(chat_trace, 16 * multiple, 2400 // (16 * multiple))
    replayed, wl = _replay(hashed, 16 * multiple, 2400 // (16 * multiple))
    assert "hashed trace" in wl.description
    assert original["hit_tokens"].tolist() == replayed["hit_tokens"].tolist()
    assert original["ttft"].tolist() == replayed["ttft"].tolist()
    assert original["hit_tokens"].sum() > 0 and original["prompt_tokens"].tolist() == replayed["prompt_tokens"].tolist()


@pytest.mark.parametrize("block_size", [8, 24])
def test_finer_or_non_multiple_block_sizes_are_refused(chat_trace, tmp_path, block_size):
    hashed = tmp_path / "h.jsonl"
    anonymize(chat_trace, hashed, block_size=16, secret="k3y")
    with pytest.raises(ConfigError, match=f"hashed trace at block size 16 .* not at {block_size}"):
        _replay(hashed, block_size, 400)


def test_hashed_trace_holds_no_token_ids_and_keyed_labels(chat_trace, tmp_path):
    hashed = tmp_path / "h.jsonl"
    s = anonymize(chat_trace, hashed, block_size=16, secret="k3y")
    lines = hashed.read_text().splitlines()
    header = json.loads(lines[0])["apcsim_trace"]
    assert header["kind"] == "hashed" and header["block_size"] == 16 and header["requests"] == s.requests
    recs = [json.loads(x) for x in lines[1:]]
    original = list(read_trace(chat_trace))
    assert [r["arrival"] for r in recs] == [r.arrival for r in original]  # order and arrivals kept
    assert all("tokens" not in r and "salt" not in r for r in recs)
    tenants = {r["tenant"] for r in recs}  # u0..u3 through the keyed hash: 4 labels, none readable
    assert len(tenants) == 4 and all(re.fullmatch(r"tenant-[0-9a-f]{12}", t) for t in tenants)
    assert len({r["session"] for r in recs}) == len({r.session for r in original})
    first = recs[0]
    assert first["last_block_tokens"] == first["input_length"] + first["output_ids"] - 16 * (len(first["hash_ids"]) - 1)
    other = tmp_path / "h2.jsonl"
    anonymize(chat_trace, other, block_size=16, secret="another")
    assert json.loads(other.read_text().splitlines()[1])["hash_ids"] != first["hash_ids"]


def test_salt_and_lora_separate_namespaces_in_the_hashes(tmp_path):
    tokens = token_array(list(range(40)))
    reqs = [TraceRequest("a", 0.0, tokens, 2), TraceRequest("b", 1.0, tokens, 2, salt="s"),
            TraceRequest("c", 2.0, tokens, 2, lora="l"), TraceRequest("d", 3.0, tokens, 2)]
    src = tmp_path / "t.jsonl"
    write_trace(src, reqs)
    anonymize(src, tmp_path / "h.jsonl", block_size=16, secret="x")
    ids = [json.loads(x)["hash_ids"] for x in (tmp_path / "h.jsonl").read_text().splitlines()[1:]]
    assert ids[0] == ids[3] and len({tuple(i[:1]) for i in ids[:3]}) == 3


def test_cli_anonymize(chat_trace, tmp_path, capsys):
    assert main(["anonymize", str(chat_trace), "--block-size", "32", "--salt", "s", "--out",
                 str(tmp_path / "h.jsonl")]) == 0
    assert "block size 32 or a multiple" in capsys.readouterr().out
    assert main(["anonymize", str(chat_trace), "--block-size", "32", "--salt", "", "--out",
                 str(tmp_path / "h.jsonl")]) == 2


def test_bailian_sessions_follow_parent_chat_ids():
    reqs = list(load_bailian(EXAMPLES / "bailian.jsonl", type_as_tenant=True))
    assert [r.id for r in reqs] == ["bl-0", "bl-1", "bl-2"]
    assert [r.session for r in reqs] == ["bl-s0", "bl-s1", "bl-s0"] and [r.tenant for r in reqs] == [
        "text", "search", "text"]
    assert [len(r.tokens) for r in reqs] == [40, 35, 70] and [r.output_tokens for r in reqs] == [12, 30, 8]
    first, third = token_array(reqs[0].tokens), token_array(reqs[2].tokens)
    assert first[:32].tolist() == third[:32].tolist() == list(range(32)) and first[32] != third[32]


def test_bailian_workload_replays_like_mooncake(tmp_path):
    cfg = config_from_dict({"name": "bl", "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_model_len": 256},
                            "workload": {"kind": "bailian", "path": str(EXAMPLES / "bailian.jsonl")}})
    res, wl = replay_experiment(cfg, progress=False)
    assert res.requests["hit_tokens"].tolist() == [0, 32, 32] and wl.description.startswith("bailian bailian.jsonl")


def test_bailian_bad_lines_skip_and_count(tmp_path):
    good = {"chat_id": 0, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 16, "output_length": 2,
            "hash_ids": [0]}
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (good, {**good, "chat_id": 0}, {**good, "chat_id": 2,
                                                                                     "color": 1})) + "\n")
    with pytest.raises(TraceFormatError, match="b.jsonl:2: field 'chat_id': duplicate chat_id 0"):
        list(load_bailian(path))
    from workloads.errors import SkipLog

    log = SkipLog()
    assert len(list(load_bailian(path, skip_bad_lines=True, skip_log=log))) == 1 and log.skipped_lines == [2, 3]


def test_convert_mooncake_and_bailian_examples(tmp_path):
    for fmt, name, n in (("mooncake", "mooncake.jsonl", 3), ("bailian", "bailian.jsonl", 3)):
        out = tmp_path / f"{fmt}.jsonl"
        s = convert(EXAMPLES / name, out, ConvertOptions(format=fmt, progress=False))
        assert s.requests == n and len(list(read_trace(out))) == n


def test_a_bailian_path_that_is_not_a_file_is_refused_by_kind_before_any_read(tmp_path: Path) -> None:
    """The same check as every trace reader (workloads.trace_codecs.check_trace_path)."""
    import os

    from workloads.trace_lines import TraceInputError

    with pytest.raises(FileNotFoundError, match="no such trace file"):
        load_bailian(tmp_path / "missing.jsonl")
    with pytest.raises(TraceInputError, match="is a directory"):
        load_bailian(tmp_path)
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    with pytest.raises(TraceInputError, match="is a FIFO, not a regular file"):
        load_bailian(fifo)
