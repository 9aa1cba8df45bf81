"""Your own traffic in: text logs and benchmark datasets to apcsim's canonical token trace
(``apcsim convert``), and canonical traces to shareable hashed traces (``apcsim anonymize``).

Modules: ``tokenizer`` (a local HF ``tokenizers`` file or model folder, or the byte-level
``approx`` stand-in), ``chat_template`` (the model's jinja chat template, rendered the way
``transformers``' ``apply_chat_template`` does), ``conversation`` (a chat as one request per turn,
each turn's prompt the previous prompt plus its answer, token for token), ``formats`` (the readers
of each input format), ``timestamps``, ``writer`` (the streaming driver). Mirrors nothing in vLLM
beyond what its OpenAI server does to a chat request before the engine sees it (template, then
tokenize without special tokens). Imports sim.core and ``workloads`` only (neither simpy nor torch).
"""
