"""The word cache of apcsim convert's tokenizer (workloads.convert.word_cache) is exact: its cut
before " " + letter ends a pre-token of the library's own pre-tokenizer and leaves each part
pre-tokenized as in the whole text (GPT-2's byte-level regex and Llama 3's cl100k Split), the ids
through the cache are the library's, only the recognized tokenizer configurations use it, and a
conversion with it writes the bytes of the former path on the bundled example and the benchmark's
generated logs."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from convert_tokenizer import make_model_folder, sentence, shared_model_folder
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from workloads.convert import word_cache
from workloads.convert.tokenizer import load_tokenizer
from workloads.convert.word_cache import CL100K_REGEX, CUT, split_words, words_safe
from workloads.convert.writer import ConvertOptions, convert

ROOT = Path(__file__).resolve().parents[1]

GPT2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
CL100K = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(CL100K_REGEX), behavior="isolated"),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

# letters (ASCII, accented, CJK, a combining accent), numbers (decimal, 1/2, a Roman numeral),
# every kind of space the regexes tell apart, contractions in both cases, symbols, an emoji
_atoms = st.sampled_from([
    "a", "Z", "the", "cache", "é", "ü", "中文", "e\u0301", "7", "42", "1234", "½", "Ⅻ",
    " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\u00a0", "\u2028", "\u3000",
    "'s", "'S", "'ll", "'Re", "'", ".", ",", "?!", "-", "_", "(", "`", "<|eot_id|>", "😀", "\u200d",
])
_spaces = st.lists(st.sampled_from([" ", " ", "\t", "\n", "\r", "\x0b", "\x1c", "\u00a0", "\u3000"]),
                   max_size=3).map("".join)
# runs of spaces between atoms: every seam (space/newline run, then a letter, digit or symbol) is common
_texts = st.lists(st.tuples(_spaces, _atoms).map("".join), max_size=16).map("".join)


def _pieces(pre: pre_tokenizers.PreTokenizer, text: str) -> list[str]:
    return [piece for piece, _ in pre.pre_tokenize_str(text)]


@settings(max_examples=500, deadline=None)
@given(text=_texts)
@example(text="x \n\nA  b\t c\u00a0 d 's 7 e")
def test_word_cut_ends_a_pre_token_and_each_part_pre_tokenizes_alone(text):
    words = split_words(text)
    parts = words[:1] + [" " + w for w in words[1:]]
    assert "".join(parts) == text and words == CUT.split(text)  # str.split where it may, the regex's cut
    for pre in (GPT2, CL100K):
        assert [p for part in parts for p in _pieces(pre, part)] == _pieces(pre, text)


def _cl100k_folder(folder: Path) -> Path:
    """A byte-level BPE trained here with Llama 3's pre-tokenizer (cl100k Split, then ByteLevel), on
    sentences joined by runs of spaces and newlines, so that it merges those runs (a cut inside one
    would change the ids)."""
    import random

    rng = random.Random(1)
    hf = Tokenizer(models.BPE(unk_token=None))
    hf.pre_tokenizer = CL100K
    hf.decoder = decoders.ByteLevel()
    seams = [" ", "  ", "   ", "\n", "\n\n", " \n", "  \n", "\t", " 42 ", " (x) "]
    corpus = ["".join(sentence(rng, rng.randint(3, 12)) + rng.choice(seams) for _ in range(4)) for _ in range(2000)]
    hf.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|eot_id|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def cl100k_file(tmp_path_factory) -> Path:
    return _cl100k_folder(tmp_path_factory.mktemp("cl100k"))


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(_texts, min_size=1, max_size=6), which=st.sampled_from(["gpt2", "cl100k"]))
def test_word_cache_gives_the_librarys_ids(texts, which, cl100k_file):
    tok = load_tokenizer(str(shared_model_folder() if which == "gpt2" else cl100k_file))
    assert tok._words is not None
    plain = tok.encode_batch(texts, cached=False)
    for _ in range(2):  # new words, then every word from the cache
        assert tok.encode_batch(texts) == plain
        assert tok.encode_json(texts) == [(",".join(map(str, ids)), len(ids)) for ids in plain]
        tok._reset_cache()  # the pieces again, through the word cache


def test_word_cache_across_resets(monkeypatch: pytest.MonkeyPatch):
    """A full word cache is emptied and refilled: the same ids."""
    monkeypatch.setattr(word_cache, "WORDS_LIMIT", 6)
    tok = load_tokenizer(str(shared_model_folder()))
    texts = [f"the cache {i} hit prefix token {i * 7}" for i in range(20)]  # 5 words each
    for chunk in [texts[k:k + 2] for k in range(0, 20, 2)] + [texts[::-1]]:
        assert tok.encode_json(chunk) == [(",".join(map(str, ids)), len(ids))
                                          for ids in tok.encode_batch(chunk, cached=False)]
        if len(chunk) == 2:  # emptied when full (43 words in all), then refilled with one call's words
            assert tok._words is not None and len(tok._words._first) + len(tok._words._later) <= 6 + 5 * 2


def _config(folder: Path, change) -> dict:
    data = json.loads((folder / "tokenizer.json").read_text())
    change(data)
    return data


@pytest.mark.parametrize("change", [
    lambda d: d.update(normalizer={"type": "NFC"}),  # a normalizer: NFC could join across a cut
    lambda d: d["model"].update(dropout=0.1),  # random merges
    lambda d: d["pre_tokenizer"].update(add_prefix_space=True),  # a text's start is marked
    lambda d: d["pre_tokenizer"].update(use_regex=False),  # no split at all: one pre-token
    lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                      "split": True}),
    lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": CL100K_REGEX.replace("{1,3}", "")}, "behavior": "Isolated",
         "invert": False}, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}),
], ids=["normalizer", "dropout", "prefix-space", "no-regex", "metaspace", "other-split"])
def test_word_cache_only_for_the_proved_configurations(change):
    folder = shared_model_folder()
    assert words_safe(_config(folder, lambda d: None))
    assert not words_safe(_config(folder, change))


def test_word_cache_recognizes_llamas_pre_tokenizer(cl100k_file):
    assert words_safe(json.loads(cl100k_file.read_text()))
    assert load_tokenizer(str(cl100k_file), words=False)._words is None


def _bench_logs(folder: Path, lines: int) -> list[tuple[Path, str]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_convert import LOGS

    out = []
    for name, (write, turns) in LOGS.items():
        write(folder / f"{name}.jsonl", lines)
        out.append((folder / f"{name}.jsonl", turns))
    return out


def test_conversion_with_the_word_cache_writes_the_former_bytes(tmp_path):
    """The bundled OpenAI example and the benchmark's two generated logs (300 lines each), with the
    tests' trained tokenizer: the word cache on, off, and the former serialization write the same
    trace."""
    model = make_model_folder(tmp_path / "model")
    inputs = [(ROOT / "workloads/data/examples/openai_chat.jsonl", t) for t in ("all", "last")]
    for src, turns in inputs + _bench_logs(tmp_path, 300):
        digests = set()
        for kw in ({"words": True}, {"words": False}, {"reference": True}):
            out = tmp_path / "out.jsonl"
            convert(src, out, ConvertOptions(format="openai", tokenizer=str(model), turns=turns,  # type: ignore[arg-type]
                                             progress=False, batch=64, **kw))
            digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
        assert len(digests) == 1, src.name


def test_truncation_and_padding_of_the_tokenizer_file_are_off(tmp_path):
    """A tokenizer.json carrying truncation (4 tokens) and padding (to 16): the prompt is encoded
    whole and unpadded, as transformers' encode does unless asked, through every path."""
    data = json.loads((shared_model_folder() / "tokenizer.json").read_text())
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "<|eot_id|>"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    texts = ["the cache prefix token hit miss the cache<|eot_id|>x"]
    want = load_tokenizer(str(shared_model_folder())).encode_batch(texts, cached=False)
    assert len(want[0]) > 4
    for words in (True, False):
        tok = load_tokenizer(str(tmp_path / "tokenizer.json"), words=words)
        assert tok.encode_batch(texts, cached=False) == tok.encode_batch(texts) == want
