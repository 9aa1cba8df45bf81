"""Property (issue 35): for random multi-turn conversations, turn k+1's prompt starts with turn k's
prompt plus its answer, token for token, so a replay on an unbounded pool hits all of turn k's full
blocks (prompt and the answer's blocks the decode filled)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from convert_tokenizer import make_model_folder, shared_model_folder, shared_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.request import token_array
from sim.experiment.config import config_from_dict
from sim.experiment.run import replay_experiment
from workloads.convert.conversation import Chat, build_requests, plan_chat
from workloads.convert.tokenizer import load_tokenizer
from workloads.convert.writer import ConvertOptions, convert
from workloads.trace_format import read_trace

BLOCK = 16
_TMP = tempfile.TemporaryDirectory(prefix="apcsim-convert-props-")

_model, _tokenizer = shared_model_folder, shared_tokenizer


# words the tokenizer knows, pieces it must split, and text at the seams: spaces, newlines, accents,
# a special token written inside a message
_words = st.sampled_from(["the", "cache", "prefix", " ", "  ", "\n", "héllo", "token?", "<|eot_id|>", "x", "42",
                          "Hit", "miss.", "\t", "ü"])
_text = st.lists(_words, min_size=0, max_size=12).map("".join)
_turn = st.tuples(_text.filter(lambda t: t.strip() != ""), _text)


@st.composite
def conversations(draw: st.DrawFn) -> Chat:
    messages = [{"role": "system", "content": draw(_text)}] if draw(st.booleans()) else []
    for user, answer in draw(st.lists(_turn, min_size=2, max_size=4)):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    if draw(st.booleans()):
        messages.pop()  # end on a user message: the last turn's answer is a count
    return Chat(id="c", messages=messages, answer_tokens=draw(st.integers(1, 20)), arrival=100.0)


@settings(max_examples=60, deadline=None)
@given(chat=conversations(), tokenizer=st.sampled_from(["trained", "approx"]))
def test_next_turn_starts_with_this_turn_and_its_answer(chat, tokenizer):
    tok = _tokenizer(tokenizer)
    if chat.messages[-1]["role"] == "assistant":
        chat.answer_tokens = None
    plan = plan_chat(chat, tok.template, "all", 256)
    reqs = build_requests(plan, tok.encode_batch(plan.pieces), 10.0)
    assert len(reqs) == sum(m["role"] == "assistant" for m in chat.messages) + (
        chat.messages[-1]["role"] != "assistant")
    for k in range(len(reqs) - 1):
        prompt, answer = token_array(reqs[k].tokens).tolist(), reqs[k].output_token_ids.tolist()
        assert token_array(reqs[k + 1].tokens).tolist()[: len(prompt) + len(answer)] == prompt + answer
    # the first turn's prompt is the template's text tokenized whole (nothing before it to cut at)
    first = tok.template.render(chat.messages[:1 + (chat.messages[0]["role"] == "system")],
                                add_generation_prompt=True)
    assert token_array(reqs[0].tokens).tolist() == tok.encode_batch([first])[0]


@settings(max_examples=12, deadline=None)
@given(chats=st.lists(conversations(), min_size=1, max_size=3))
def test_replay_on_an_unbounded_pool_hits_every_full_block_of_the_previous_turn(chats):
    folder = Path(tempfile.mkdtemp(dir=_TMP.name))
    lines = []
    for i, chat in enumerate(chats):
        rec = {"id": f"c{i}", "messages": chat.messages, "created": 1000 + 500 * i}
        if chat.messages[-1]["role"] != "assistant":
            rec["usage"] = {"completion_tokens": chat.answer_tokens}
        lines.append(json.dumps(rec))
    (folder / "log.jsonl").write_text("\n".join(lines) + "\n")
    convert(folder / "log.jsonl", folder / "t.jsonl", ConvertOptions(format="openai", tokenizer=str(_model()),
                                                                     progress=False))
    reqs = {r.id: r for r in read_trace(folder / "t.jsonl")}
    cfg = config_from_dict({"name": "p", "engine": {"block_size": BLOCK, "num_gpu_blocks": 4096,
                                                    "max_model_len": 4096},
                            "latency": {"kind": "fixed", "step_time_s": 0.001},
                            "workload": {"kind": "trace", "path": str(folder / "t.jsonl")}})
    res, _ = replay_experiment(cfg, progress=False)
    hits = dict(zip(res.requests["request_id"], res.requests["hit_tokens"], strict=True))
    for rid, req in reqs.items():
        conv, _, turn = rid.partition("-t")
        if turn and int(turn) > 1:
            prev = reqs[f"{conv}-t{int(turn) - 1}"]
            # the decode computes every token but the last answer token; its full blocks are cached
            computed = len(prev.tokens) + prev.output_tokens - 1
            assert hits[rid] >= min(computed, len(req.tokens) - 1) // BLOCK * BLOCK


_specials = st.sampled_from(["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                             "<|eot_id", "|>", "<"])


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(st.lists(st.one_of(_words, _specials), max_size=16).map("".join), min_size=1, max_size=8))
def test_segment_cache_gives_the_librarys_ids(texts):
    """The cut at added tokens (workloads.convert.tokenizer) equals the library tokenizing whole,
    with pieces repeated across texts and calls (cache hits) and near-miss token spellings."""
    tok = _tokenizer("trained")
    assert tok.encode_batch(texts) == tok.encode_batch(texts, cached=False)
    assert tok.encode_batch(texts[::-1]) == tok.encode_batch(texts[::-1], cached=False)


def test_segment_cache_is_off_when_an_added_token_strips_whitespace(tmp_path):
    folder = make_model_folder(tmp_path / "m")
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"][3]["rstrip"] = True  # <|eot_id|> eats the whitespace after it
    (folder / "tokenizer.json").write_text(json.dumps(data))
    tok = load_tokenizer(str(folder))
    assert tok._split is None
    text = "the cache<|eot_id|>   \n hit"
    assert tok.encode_batch([text]) == tok.encode_batch([text], cached=False)


def test_segment_cache_is_off_for_tokenizers_that_mark_a_texts_start(tmp_path):
    """A Metaspace pre-tokenizer (prepend_scheme first: Llama-2/Mistral style) treats the first piece
    of a text unlike the pieces after an added token: no cache, and the ids are the library's."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE(unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    hf.train_from_iterator(["the cache hit", "a prefix miss"] * 50, trainers.BpeTrainer(
        vocab_size=80, special_tokens=["<|eot_id|>"], show_progress=False))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok._split is None
    text = "the cache<|eot_id|>hit the"
    assert tok.encode_batch([text]) == tok.encode_batch([text], cached=False)
