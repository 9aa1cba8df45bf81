"""The tokenizer of ``apcsim convert``: a real one from a local Hugging Face ``tokenizer.json``
(the Rust ``tokenizers`` library, as vLLM's fast tokenizers are), or an explicit byte-level
stand-in.

Rules:

* ``--tokenizer PATH``: PATH is a ``tokenizer.json`` (its folder may hold ``tokenizer_config.json``)
  or a model folder holding ``tokenizer.json`` and, for chat logs, ``tokenizer_config.json`` with
  the chat template (``workloads.convert.chat_template``). Nothing is downloaded.
* no tokenizer: one line saying how to get one (a local HF model folder), unless
  ``--tokenizer approx`` is chosen: token ids are the text's UTF-8 bytes (ids 0-255; special tokens
  such as ``<|im_start|>`` are plain text) and the chat template is a small ChatML one. Hit rates
  from it are approximate; the output trace's header says ``approximate: true`` and every summary
  that replays it says so.
* text is encoded without adding special tokens (``add_special_tokens=False``), as transformers'
  ``apply_chat_template(tokenize=True)`` does: the template already wrote BOS where the model
  wants one.

**Segment cache** (speed; exact): the ``tokenizers`` library first cuts a text at its added tokens
(``<|eot_id|>``, ...; leftmost-longest) and tokenizes the pieces between them independently. When
no added token strips whitespace or matches whole words only (``lstrip``/``rstrip``/``single_word``
off), none is matched after normalization and nothing marks the start of a text (a ``Metaspace``
pre-tokenizer, a ``Prepend`` normalizer, ``add_prefix_space``: Llama-2/Mistral-style tokenizers),
cutting there ourselves and tokenizing each piece
alone gives the same ids, so a piece seen before (a system prompt, a tool list, a role header) is
taken from a cache instead of being tokenized again. Otherwise every text goes to the library
whole. ``encode_batch(texts, cached=False)`` is the plain path, the cache's oracle in the tests.

**Word cache** (speed; exact): a piece not in the segment cache is cut further into words, for
the tokenizers where that is proved exact (``workloads.convert.word_cache``: GPT-2's and Llama 3's
byte-level BPE), and a word seen before takes its ids from a cache, so on new text the library runs
only on words it never saw. Piece entries made from words keep their ids as text only.

**Serialized ids** (speed; exact): the cache keeps each piece's ids also as their JSON text
(``"12,7,301"``), so :meth:`Tokenizer.encode_json` gives a text's ids as that text and their count
without a Python int per token: a prompt's ``tokens`` field is the comma-join of its pieces' texts
(``workloads.convert.batch``). A history resent on every line of a log is thus tokenized and
serialized once per message, not once per line.

Invariants: :meth:`Tokenizer.encode_batch` and :meth:`Tokenizer.encode_json` are pure functions of
the texts (``encode_json``'s text is ``",".join(map(str, ids))`` of ``encode_batch``'s ids). Errors are
:class:`TokenizerError` (one line naming the file). Imports ``tokenizers`` (lazily) and jinja2.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.core.errors import ApcsimError
from workloads.convert.chat_template import ChatTemplate, TemplateRenderError
from workloads.convert.word_cache import WordCache, words_safe

APPROX = "approx"

NO_TOKENIZER = (
    "no tokenizer: give --tokenizer PATH, a local Hugging Face model folder holding tokenizer.json and "
    "tokenizer_config.json (e.g. `huggingface-cli download MODEL tokenizer.json tokenizer_config.json "
    "--local-dir DIR` on a machine with access), or --tokenizer approx for a byte-level stand-in "
    "(hit rates approximate)"
)

APPROX_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The ``approx`` tokenizer's chat template (ChatML, the shape of many open models' templates)."""


class TokenizerError(ApcsimError, ValueError):
    """A tokenizer that cannot be loaded; ``str()`` names the file."""


CACHE_LIMIT = 1 << 14
"""Pieces the segment cache keeps (emptied when full). Smaller is faster on new text: a log's
repeated pieces (system prompts, tool lists, the open conversations' messages: a few thousand in the
benchmark's session log) fit, and the never-repeated ones do not spread lookups over a large table
(1 << 16 measured 4-5% more CPU per line on both benchmark logs)."""


Encoded = tuple[str, int, list[int] | None]
"""A cache entry: the ids' JSON text (no brackets), their count, the ids (None: not kept, read
from the text when asked)."""


def _entry(ids: list[int], text: list[str]) -> Encoded:
    """An entry from ids; ``text[i]`` is ``str(i)`` (a table: five times faster than ``str``)."""
    try:
        return ",".join([text[i] for i in ids]), len(ids), ids
    except IndexError:  # an id beyond the vocabulary's table (not from a well-formed tokenizer)
        return ",".join(map(str, ids)), len(ids), ids


@dataclass
class Tokenizer:
    """Encodes texts to token ids; ``template`` renders chats (None: the model has none)."""

    name: str
    approximate: bool
    template: ChatTemplate | None
    fingerprint: str  # sha256 prefix of tokenizer.json + the template (what the header records)
    _hf: Any = None
    segment_safe: bool = False  # the normalizer and pre-tokenizer treat every cut piece alike (see above)
    _split: re.Pattern[str] | None = None  # the added tokens, longest first (None: no segment cache)
    _firsts: dict[str, tuple[str, ...]] | None = None  # the same tokens by first character (None: cut by _split)
    _special: dict[str, int] = field(default_factory=dict)
    _cache: dict[str, Encoded] = field(default_factory=dict)  # text piece (or added token) -> its ids
    _id_text: list[str] = field(default_factory=list)  # str(i) for every id of the vocabulary
    words: bool = False  # a word cache under the segment cache, where it is exact (workloads.convert.word_cache)
    _words: WordCache | None = None

    def __post_init__(self) -> None:
        if self._hf is None:  # approx: the ids are bytes
            self._id_text = [str(i) for i in range(256)]
            return
        top = max(self._hf.get_vocab(with_added_tokens=True).values(), default=-1)
        self._id_text = [str(i) for i in range(top + 1)]
        if not self.segment_safe:
            return
        added = self._hf.get_added_tokens_decoder()
        if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values()):
            return  # the library's own cut is not a plain leftmost-longest match: no cache
        self._special = {t.content: i for i, t in added.items()}
        alternatives = sorted(self._special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(a) for a in alternatives) + ")")
        if all(alternatives):
            firsts: dict[str, list[str]] = {}
            for token in alternatives:  # longest first within each list, as in the alternation
                firsts.setdefault(token[0], []).append(token)
            self._firsts = {c: tuple(tokens) for c, tokens in firsts.items()}
        self._reset_cache()
        if self.words:
            self._words = WordCache(self._hf, self._id_text)

    def _reset_cache(self) -> None:
        self._cache.clear()
        self._cache.update({token: _entry([i], self._id_text) for token, i in self._special.items()})

    def _cuts(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text cut at its added tokens (``text, token, text, ..., text``), every part in the
        cache (the added tokens always are; the missing pieces are encoded in one call). A cache
        grown past :data:`CACHE_LIMIT` by the call before is emptied first."""
        assert self._split is not None and self._hf is not None
        cache = self._cache
        if len(cache) > CACHE_LIMIT:
            self._reset_cache()
        cuts = cut_texts(list(texts), self._split, self._firsts)
        if self._words is not None:
            self._words.fill(cuts, cache)
            return cuts
        missing = _missing(cuts, cache)
        for part, enc in zip(missing, self._hf.encode_batch_fast(missing, add_special_tokens=False), strict=True):
            cache[part] = _entry(enc.ids, self._id_text)
        return cuts

    def encode_batch(self, texts: Sequence[str], *, cached: bool = True) -> list[list[int]]:
        """Token ids of each text (no special tokens added); ``cached=False`` skips the segment
        cache (same ids)."""
        if self._hf is None:
            return [list(t.encode("utf-8")) for t in texts]
        if self._split is None or not cached:
            return [enc.ids for enc in self._hf.encode_batch_fast(list(texts), add_special_tokens=False)]
        cache = self._cache
        out: list[list[int]] = []
        for parts in self._cuts(texts):
            ids: list[int] = []
            for part in parts:
                if part:
                    text, count, known = cache[part]
                    ids += known if known is not None else [int(i) for i in text.split(",")] if count else []
            out.append(ids)
        return out

    def encode_json(self, texts: Sequence[str]) -> list[tuple[str, int]]:
        """Each text's ids as ``(",".join(map(str, ids)), len(ids))`` (see the module docstring)."""
        if self._split is None:
            return [_entry(ids, self._id_text)[:2] for ids in self.encode_batch(texts)]
        return _joined(self._cuts(texts), self._cache)


def cut_texts(texts: list[str], split: re.Pattern[str], firsts: dict[str, tuple[str, ...]] | None) -> list[list[str]]:
    """Each text cut at the added tokens: ``split.split(text)`` (the definition), or the compiled
    ``word_scan.cut`` over ``firsts`` (the tokens by first character, longest first) where built."""
    if firsts is None or _cut is None:
        return [split.split(t) for t in texts]
    return _cut(texts, firsts)


def missing_parts(cuts: list[list[str]], cache: dict[str, Encoded]) -> list[str]:
    """The distinct non-empty parts of ``cuts`` not in ``cache`` (the compiled
    ``word_scan.missing``'s definition; any order)."""
    return list({part for parts in cuts for part in parts if part and part not in cache})


def joined_parts(cuts: list[list[str]], cache: dict[str, Encoded]) -> list[tuple[str, int]]:
    """Per list of parts, its ids' text and count from ``cache`` (the compiled
    ``word_scan.joined``'s definition)."""
    out: list[tuple[str, int]] = []
    for parts in cuts:
        entries = [cache[part] for part in parts if part]
        out.append((",".join([e[0] for e in entries if e[1]]), sum([e[1] for e in entries])))
    return out


_missing: Callable[[list[list[str]], dict[str, Encoded]], list[str]]
_joined: Callable[[list[list[str]], dict[str, Encoded]], list[tuple[str, int]]]
try:
    from workloads.convert.word_scan import joined as _joined
    from workloads.convert.word_scan import missing as _missing
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _missing, _joined = missing_parts, joined_parts
_cut: Callable[[list[str], dict[str, tuple[str, ...]]], list[list[str]]] | None
try:
    from workloads.convert.word_scan import cut as _cut
except ImportError:  # pragma: no cover - an extension built before cut was added, or none
    _cut = None


def _json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TokenizerError(f"{path}:1: {what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path}:{exc.lineno}: {what} is not JSON: {exc.msg} (column {exc.colno})") from None


def _template(folder: Path) -> tuple[ChatTemplate | None, str]:
    cfg_path = folder / "tokenizer_config.json"
    jinja_path = folder / "chat_template.jinja"
    config = _json_file(cfg_path, "tokenizer_config.json") if cfg_path.is_file() else {}
    if not isinstance(config, dict):
        raise TokenizerError(f"{cfg_path}:1: expected a JSON object")
    jinja = jinja_path.read_text(encoding="utf-8") if jinja_path.is_file() else None
    try:
        template = ChatTemplate.from_config(config, jinja)
    except TemplateRenderError as exc:
        line = f":{exc.template_line}" if exc.template_line else ""
        where = jinja_path if config.get("chat_template") is None else cfg_path
        raise TokenizerError(f"{where}{line}: field 'chat_template': {exc.message}") from None
    text = "" if template is None else json.dumps(dict(template.templates), sort_keys=True)
    return template, text


def load_tokenizer(spec: str | None, *, words: bool = True) -> Tokenizer:
    """The tokenizer named by ``--tokenizer`` (see the module docstring); ``words=False`` keeps the
    word cache off (the benchmark's and the tests' former path). Raises :class:`TokenizerError`."""
    if spec is None or spec == "":
        raise TokenizerError(NO_TOKENIZER)
    if spec == APPROX:
        fp = hashlib.sha256(APPROX_TEMPLATE.encode()).hexdigest()[:16]
        return Tokenizer("approx (UTF-8 bytes)", True, ChatTemplate({"default": APPROX_TEMPLATE}), fp)
    path = Path(spec)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"{path}: no tokenizer.json in this folder (a Hugging Face model folder holds one)")
    elif path.is_file():
        file = path
    else:
        raise TokenizerError(f"{spec}: no such tokenizer file or folder ({NO_TOKENIZER})")
    data = _json_file(file, "the tokenizer file")
    if not isinstance(data, dict) or "model" not in data:
        raise TokenizerError(f"{file}:1: not a Hugging Face tokenizer.json (no 'model' section)")
    from tokenizers import Tokenizer as HFTokenizer

    try:
        hf = HFTokenizer.from_str(json.dumps(data))
    except Exception as exc:  # the Rust library raises plain Exception with its serde message
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(f"{file}:1: not a tokenizer the tokenizers library can load: {first}") from None
    # a tokenizer.json may carry truncation and padding (a 512-token cap, a fixed length); transformers'
    # encode turns both off unless asked (PreTrainedTokenizerFast.set_truncation_and_padding), as
    # apply_chat_template(tokenize=True) and vLLM's prompts do: the whole prompt, nothing added
    hf.no_truncation()
    hf.no_padding()
    template, template_text = _template(file.parent)
    digest = hashlib.sha256(file.read_bytes() + template_text.encode()).hexdigest()[:16]
    name = file.parent.name if path.is_dir() else str(file)
    start_marks = json.dumps([data.get("normalizer"), data.get("pre_tokenizer")])
    safe = not any(m in start_marks for m in ('"Metaspace"', '"Prepend"', '"add_prefix_space": true'))
    return Tokenizer(name, False, template, digest, hf, safe, words=words and words_safe(data))
