"""A tiny model folder for the conversion tests and benchmark: a byte-level BPE tokenizer trained at
test time with the ``tokenizers`` library on generated text (nothing downloaded), and a
``tokenizer_config.json`` holding a Llama-3-style chat template written here (header tokens, trimmed
content, end-of-turn token, a tools preamble through ``tojson``, ``raise_exception`` on an unknown
role)."""

from __future__ import annotations

import functools
import json
import random
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from workloads.convert import tokenizer as workload_tokenizer

SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

LLAMA3_STYLE_TEMPLATE = """{{- bos_token }}
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nYou may call these tools:\\n' }}
{%- for tool in tools %}
{{- tool | tojson }}
{{- '\\n' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role ' + message['role']) }}
{%- endif %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

WORDS = ("the cache block prefix token model request answer question system user hello world vllm "
         "serving latency memory batch prompt engine schedule hit miss tenant session turn agent tool "
         "python code function result error value list string number time fast slow good").split()


def sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice([".", "?", "!", ""])


def make_model_folder(folder: Path, *, vocab_size: int = 600, seed: int = 0) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder``; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    corpus = [sentence(rng, rng.randint(3, 30)) for _ in range(3000)]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>", "special": True},
              "chat_template": LLAMA3_STYLE_TEMPLATE, "model_max_length": 8192}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


_SHARED: list[tempfile.TemporaryDirectory[str]] = []  # removed when the test process exits


@functools.cache
def shared_model_folder() -> Path:
    """One model folder (:func:`make_model_folder`) per process, made on first use."""
    _SHARED.append(tempfile.TemporaryDirectory(prefix="apcsim-convert-model-"))
    return make_model_folder(Path(_SHARED[0].name) / "model")


@functools.cache
def shared_tokenizer(name: str) -> workload_tokenizer.Tokenizer:
    """``approx`` (the approximate tokenizer) or, for any other name, :func:`shared_model_folder`'s."""
    return workload_tokenizer.load_tokenizer("approx" if name == "approx" else str(shared_model_folder()))
