"""Lookahead block hashes (mirrors ``get_request_block_hasher(..., num_hash_lookahead_tokens)`` and
``generate_lookahead_block_hash_extra_keys`` of vLLM 0.33.0's ``vllm/v1/core/kv_cache_utils.py``).

With EAGLE, the drafter's KV at a block's last position depends on the next token, so vLLM 0.33
hashes each block together with the ``L`` tokens after it (``VllmConfig.num_hash_lookahead_tokens``,
1 for EAGLE with prefix caching and no KV connector) instead of dropping the last hit block
(0.25.1's ``use_eagle``):

* block *i*'s hash exists only once token ``(i + 1) * block_size + L - 1`` does (a hasher hashes
  ``(num_tokens - L) // block_size`` blocks), so a block is cached one token later
  (``cache_blocks`` caps at the hashed tokens) and a prompt's last full block is hashed only when
  a token follows it;
* its extra keys become ``(E, t_1, ..., t_L)``: ``E`` the (0.33.0: tagged) extra keys over the block
  *and* its lookahead tokens (the multimodal items overlapping ``[start, end + L)``), then the tokens.

Equal hashes therefore mean equal prefixes of ``(i + 1) * block_size + L`` tokens. The exact
hashers use these keys byte for byte; the ``fast`` hasher keeps its chain over the usual keys and
folds each block's lookahead key into the stored key (:func:`fold`), which has the same equality
structure. Imports ``sim.core.extra_keys``; neither simpy nor torch.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import TYPE_CHECKING, Any

from sim.core.extra_keys import block_extra_keys

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import Request


def lookahead_extra_keys(request: Request, start: int, num_blocks: int, block_size: int, lookahead: int) -> list[Any]:
    """The extra keys of the ``num_blocks`` full blocks from token ``start`` with ``lookahead``
    tokens each (the request must hold ``start + num_blocks * block_size + lookahead`` tokens):
    ``(E, t)`` for one lookahead token, ``(E, t_1, ..., t_L)`` for more. Pure."""
    follow = request.token_slice(start + block_size, start + num_blocks * block_size + lookahead).tolist()
    out: list[Any] = []
    for k in range(num_blocks):
        s = start + k * block_size
        extra, _ = block_extra_keys(request, s, s + block_size + lookahead, 0, tagged=True)
        toks = follow[k * block_size : k * block_size + lookahead]
        out.append((extra, toks[0]) if lookahead == 1 else (extra, *toks))
    return out


def fold(keys: list[bytes], extras: list[Any]) -> list[bytes]:
    """Each key folded with its block's lookahead extra key (the ``fast`` hasher): equal results
    exactly when the keys and the lookahead keys are equal (up to a 2^-128-scale collision). Pure."""
    return [
        hashlib.blake2b(key + pickle.dumps(extra, protocol=4), digest_size=16).digest()
        for key, extra in zip(keys, extras)
    ]
