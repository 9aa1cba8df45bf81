"""The long-context correctness case: reuse equals recompute over a 32k-token cached context.

Mirrors vLLM's prefix caching at long context (hundreds to thousands of blocks per request): a
prompt of ``context`` tokens is prefilled in chunks (``max_num_batched_tokens``), a later request
with the same prefix and a short tail hits all of its full blocks and decodes over them; every
kept logit of both is compared with one dense recompute of the longer sequence (the shorter one is
its prefix, so one causal pass serves both). Driven by :class:`gpu_backend.validation.cases.Harness` (block
tables checked after every step). Kept apart from :mod:`gpu_backend.validation.cases` for its cost: two
causal attentions over 32k tokens (one paged, one dense), minutes on a CPU.

Imports torch and numpy (through ``cases``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu_backend.attention import Attention
from gpu_backend.executor.model import LlamaModel
from gpu_backend.validation.cases import CaseResult, Harness, _outs, _toks


def case_long_context(model: LlamaModel, attention: Attention | None = None, *, context: int = 32768,
                      chunk: int | None = None, **hk: Any) -> CaseResult:
    """Long context: a ``context``-token prompt (2,048 blocks of 16 at the default) prefilled in
    chunks; a later request with the same prefix and a short tail hits all of its full blocks and
    decodes over it. Both against one dense recompute of the longer sequence."""
    bs = int(hk.get("block_size", 16))
    chunk = chunk or min(2048, max(bs, context // 4))
    tail, outs = 24, 2
    h = Harness(model, attention, num_blocks=-(-(context + tail + outs) // bs) + -(-context // bs) // 8 + 4,
                max_model_len=context + tail + outs + bs, max_num_batched_tokens=chunk, max_num_seqs=4,
                hash_algo="fast", **hk)
    prefix = _toks(40, context)
    a = h.request("a", prefix, 1, outputs=_outs(40, 1))
    b = h.request("b", np.concatenate([prefix, _toks(41, tail)]), outs, outputs=_outs(41, outs))
    n_chunks = -(-context // chunk)
    h.run({0: [a], n_chunks + 2: [b]}, max_steps=4 * n_chunks + 50)
    res = h.compare("long_context", ["a", "b"], oracle="b")
    hb = h.admissions_of("b")[0]
    res.facts["hit_blocks"] = hb.hit_tokens // bs
    res.facts["a_chunks"] = h.partial_chunks.get("a", 0) + 1
    res.facts["ok_scenario"] = (hb.hit_tokens == (context // bs) * bs and res.facts["a_chunks"] >= 3
                                and res.num_compared == 1 + outs)
    return res
