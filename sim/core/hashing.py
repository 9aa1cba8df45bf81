"""Chained block hashing, as vLLM v1 computes ``Request.block_hashes``.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``,
``generate_block_hash_extra_keys``, ``get_request_block_hasher``) and
``vllm/utils/hashing.py`` of vLLM 0.25.1:

* the hash of block *i* is ``H((parent, tokens_i, extra_keys_i))`` where ``parent`` is the hash of
  block *i-1* (``NONE_HASH`` for block 0) -- equal hashes therefore mean equal prefixes;
* only **full** blocks get a hash; the partial tail block never has one;
* extra keys (:mod:`sim.core.extra_keys`, re-exported here), in vLLM's order: the LoRA *name* on
  every block, ``(mm_identifier, offset - block_start)`` for every multimodal item overlapping the
  block, and ``cache_salt`` on the block starting at token 0 only, and only if truthy (``""``
  behaves as no salt); an empty list becomes ``None``;
* hashing resumes at ``len(block_hashes) * block_size`` whenever tokens are appended; a resumed pass
  starts its multimodal scan at the *last* item (0.25.1's ``curr_mm_idx = -1``; 0.33.0 at the first
  item overlapping the block, ``mm_resume_from_last=False``).

Hash functions:

* ``sha256`` (vLLM's default), ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``
  (:mod:`sim.core.hash_functions`): byte-identical to vLLM's when ``NONE_HASH`` is the same. vLLM
  derives ``NONE_HASH = H(PYTHONHASHSEED)`` when that variable is set; here it is
  ``H(str(hash_seed))``, so ``hash_seed: 0`` gives vLLM's hashes under ``PYTHONHASHSEED=0``. Unset,
  0.25.1 drew a random seed and 0.33.0 uses ``"vllm-none-hash"`` for the cryptographic ones
  (``resolve_none_hash_seed``; ``sim.experiment.version_keys.none_hash_seed`` picks the seed).
* ``fast``: a 128-bit chained hash computed with numpy over a whole prompt at once, for sweeps:
  the same *equality structure* (same prefix + extra keys <=> same hash, up to a 2^-128-scale
  collision chance), other bytes, about two orders of magnitude cheaper. The chain is polynomial
  so it vectorises: ``h_i = P * h_{i-1} + c_i (mod 2^64)`` per lane, ``c_i`` a digest of the
  block's tokens and extra keys, each stored hash a bijective finalisation of ``h_i``. A block of
  consecutive ids ``t, .., t+bs-1`` is digested from ``t`` (O(1) per block; a prompt held as runs,
  ``Request.token_runs``, is hashed without expanding it), any other block by splitmix64 of each
  token keyed by its position, combined by two independent random linear forms.

With ``num_lookahead_tokens`` (vLLM 0.33.0 EAGLE) a block's hash also covers the tokens after it
(:mod:`sim.core.lookahead_hashing`). Imports ``sim.core.extra_keys``, ``sim.core.lookahead_hashing``
and ``sim.core.request`` (types only); neither simpy nor torch.
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.core.extra_keys import block_extra_keys, blocks_extra_keys
from sim.core.hash_functions import EXACT_HASH_FUNCTIONS, HASH_ALGOS, hash_function
from sim.core.lookahead_hashing import fold, lookahead_extra_keys

_chain_runs: Callable[..., tuple[list[bytes], tuple[int, int]]] | None
try:  # the compiled chain over runs (same keys; built by pip install -e .)
    from sim.core.compiled_hash import chain_runs as _chain_runs
except ImportError:  # pragma: no cover - where the extension is not built
    _chain_runs = None
_chain_runs_external: Callable[..., tuple[list[bytes], array[int], tuple[int, int]]] | None
try:  # the same chain, also giving the keys' event forms (an older build lacks it: the plain path)
    from sim.core.compiled_hash import chain_runs_external as _chain_runs_external
except ImportError:  # pragma: no cover - where the extension is not built
    _chain_runs_external = None

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.request import Request

__all__ = ["HASH_ALGOS", "BlockHash", "BlockHasher", "ExactBlockHasher", "FastBlockHasher", "block_extra_keys",
           "blocks_extra_keys", "external_block_hash", "hash_function", "make_block_hasher"]

BlockHash = bytes
"""The hash of one block, as bytes (32 bytes for sha256, 16 for xxhash and fast)."""

_MASK64 = (1 << 64) - 1
_GEN_TAG = b"\x00gen"


# ----------------------------------------------------------------------------------------------
# Block hashers
# ----------------------------------------------------------------------------------------------


class BlockHasher:
    """Computes the hashes of a request's new full blocks (vLLM's ``request_block_hasher``).

    ``hash_new_blocks(request)`` returns the hashes of full blocks at indices
    ``len(request.block_hashes) ..`` up to the last full block of ``request.all_token_ids``; the
    request appends them. Subclasses differ only in the hash function.
    """

    algo: str
    block_size: int
    num_lookahead_tokens: int = 0  # vLLM 0.33.0 num_hash_lookahead_tokens (EAGLE)
    mm_resume_from_last: bool = True  # 0.25.1's resumed multimodal scan (False: 0.33.0's, extra_keys)
    tagged_extra_keys: bool = False  # 0.33.0's tagged extra keys (sim.core.extra_keys)
    prompt_key: tuple[Any, ...] | None = None  # all that fixes a prompt's keys hashed from 0 (make_block_hasher)

    def hash_new_blocks(self, request: Request) -> list[BlockHash]:  # pragma: no cover
        raise NotImplementedError

    def prompt_external_hashes(self, request: Request) -> tuple[list[BlockHash], array[int], tuple[int, int]] | None:
        """A fresh request's prompt keys, their event forms (:func:`external_block_hash`, what a router
        matches against KV events; an ``array('Q')``, no int per block) and the chain state, where made in C."""
        return None

    def hash_token_blocks(
        self, tokens: Sequence[int] | np.ndarray, extra_keys: Sequence[tuple[Any, ...] | None] | None = None
    ) -> list[BlockHash]:
        """Hashes of the full blocks of a bare token sequence (tests and tools)."""
        raise NotImplementedError  # pragma: no cover


class ExactBlockHasher(BlockHasher):
    """Byte-exact vLLM hashing: ``H((parent or NONE_HASH, tuple(tokens), extra_keys))`` per block."""

    def __init__(self, algo: str, block_size: int, hash_seed: int | str = 0, num_lookahead_tokens: int = 0) -> None:
        self.algo = algo
        self.block_size = block_size
        self.num_lookahead_tokens = num_lookahead_tokens
        self.fn = hash_function(algo)
        # vLLM: NONE_HASH = H(os.getenv("PYTHONHASHSEED")) -- the seed *string* is hashed.
        self.none_hash: bytes = self.fn(str(hash_seed))

    def _chain(self, parent: bytes | None, tokens: Sequence[int], extra: Any) -> bytes:
        return self.fn((parent or self.none_hash, tuple(tokens), extra))

    def hash_new_blocks(self, request: Request) -> list[BlockHash]:
        bs = self.block_size
        start = len(request.block_hashes) * bs
        num_tokens = request.num_tokens - self.num_lookahead_tokens
        if start + bs > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else None
        n_blocks = (num_tokens - start) // bs
        tokens = request.token_slice(start, start + n_blocks * bs)
        tok_list = tokens.tolist()
        if self.num_lookahead_tokens:
            extras: list[Any] | None = lookahead_extra_keys(request, start, n_blocks, bs, self.num_lookahead_tokens)
        else:
            extras = blocks_extra_keys(request.lora_name, request.cache_salt, request.mm_features, start, n_blocks, bs,
                                       self.mm_resume_from_last, self.tagged_extra_keys)
        out: list[BlockHash] = []
        for k in range(n_blocks):
            extra = extras[k] if extras is not None else None
            parent = self._chain(parent, tok_list[k * bs : (k + 1) * bs], extra)
            out.append(parent)
        return out

    def hash_token_blocks(
        self, tokens: Sequence[int] | np.ndarray, extra_keys: Sequence[tuple[Any, ...] | None] | None = None
    ) -> list[BlockHash]:
        bs = self.block_size
        parent: bytes | None = None
        out: list[BlockHash] = []
        for k in range(len(tokens) // bs):
            extra = extra_keys[k] if extra_keys is not None else None
            parent = self._chain(parent, [int(t) for t in tokens[k * bs : (k + 1) * bs]], extra)
            out.append(parent)
        return out


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic); a bijection of 64-bit words."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class FastBlockHasher(BlockHasher):
    """Vectorised 128-bit chained hash with vLLM's equality structure (see module docstring).

    Requests keep the un-finalised chain state of their last hashed block in
    ``request.hash_state`` (two uint64 lanes) so appended tokens continue the same chain.
    """

    _LANES = 2

    def __init__(self, block_size: int, hash_seed: int | str = 0, num_lookahead_tokens: int = 0) -> None:
        self.algo = "fast"
        self.block_size = block_size
        self.num_lookahead_tokens = num_lookahead_tokens
        seed = int.from_bytes(hashlib.blake2b(str(hash_seed).encode(), digest_size=8).digest(), "big")
        rng = np.random.Generator(np.random.PCG64(seed))
        self._pos_key = rng.integers(0, 2**63, size=block_size, dtype=np.int64).astype(np.uint64)
        self._pos_mult = rng.integers(0, 2**63, size=block_size, dtype=np.int64).astype(np.uint64) | np.uint64(1)
        self._lane_keys = rng.integers(0, 2**63, size=(self._LANES, 1), dtype=np.int64).astype(np.uint64)
        mult = rng.integers(0, 2**63, size=self._LANES, dtype=np.int64).astype(np.uint64) | np.uint64(1)
        self._p = mult  # odd multipliers: invertible mod 2^64
        self._p_inv = np.array([pow(int(p), -1, 1 << 64) for p in mult], dtype=np.uint64)
        self.initial_state: tuple[int, int] = tuple(
            int(v) for v in rng.integers(0, 2**63, size=self._LANES, dtype=np.int64)
        )  # type: ignore[assignment]
        self._pow = np.ones((self._LANES, 1), dtype=np.uint64)
        self._inv_pow = np.ones((self._LANES, 1), dtype=np.uint64)
        # drawn last, so the constants above are those of the token digest as it always was
        self._run_keys = rng.integers(0, 2**63, size=(self._LANES, 2), dtype=np.int64).astype(np.uint64)
        self._ramp = np.arange(block_size, dtype=np.uint64)
        self.compiled = True  # use sim.core.compiled_hash when built (False: the numpy oracle only)

    def _powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """P^k and P^-k for k in [0, n] per lane (grown geometrically, cached)."""
        have = self._pow.shape[1]
        if have <= n:
            size = max(n + 1, 2 * have)
            pw = np.empty((self._LANES, size), dtype=np.uint64)
            ipw = np.empty((self._LANES, size), dtype=np.uint64)
            pw[:, 0] = 1
            ipw[:, 0] = 1
            for lane in range(self._LANES):
                # cumulative product with wrap-around: numpy's cumprod on uint64 wraps mod 2^64
                pw[lane, 1:] = np.cumprod(np.full(size - 1, self._p[lane], dtype=np.uint64))
                ipw[lane, 1:] = np.cumprod(np.full(size - 1, self._p_inv[lane], dtype=np.uint64))
            self._pow, self._inv_pow = pw, ipw
        return self._pow[:, : n + 1], self._inv_pow[:, : n + 1]

    @staticmethod
    def _extra_digest(extra: tuple[Any, ...]) -> np.ndarray:
        d = hashlib.blake2b(pickle.dumps(extra, protocol=4), digest_size=16).digest()
        return np.frombuffer(d, dtype=np.uint64).copy()

    def _run_digest(self, first: np.ndarray) -> np.ndarray:
        """Digests ``(2, m)`` of blocks of consecutive ids starting at ``first`` (uint64): a keyed
        bijection of the first id per lane, independent of the token digest below."""
        return _splitmix64(_splitmix64(first[None, :] ^ self._run_keys[:, :1]) ^ self._run_keys[:, 1:])

    def _token_digest(self, blocks: np.ndarray) -> np.ndarray:
        """Digests ``(2, m)`` of ``m`` blocks given as a ``(m, bs)`` uint64 array of their tokens."""
        cons = (blocks == blocks[:, :1] + self._ramp).all(axis=1)
        if cons.all():
            return self._run_digest(blocks[:, 0])
        # c[lane, i]: each token is mixed non-linearly with a key of its position; the two lanes
        # are two independent random linear forms of those mixes (plain sum, and a sum weighted by
        # random odd multipliers), each finalised.
        mixed = _splitmix64(blocks ^ self._pos_key)
        sums = np.stack([mixed.sum(axis=1, dtype=np.uint64), (mixed * self._pos_mult).sum(axis=1, dtype=np.uint64)])
        c = _splitmix64(sums ^ self._lane_keys)
        if cons.any():
            c[:, cons] = self._run_digest(blocks[cons, 0])
        return c

    def _runs_digest(self, starts: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
        """Digests ``(2, n)`` of the first ``n`` full blocks of tokens given as runs of consecutive
        ids: a block inside one run from its first id; only blocks across a run boundary are
        expanded (they may still be consecutive: the token digest decides, as it would)."""
        bs = self.block_size
        ends = np.cumsum(lengths)
        offs = ends - lengths
        bstart = np.arange(n, dtype=np.int64) * bs
        r = np.searchsorted(ends, bstart, side="right")  # the run holding each block's first token
        first = starts[r] + (bstart - offs[r])
        inside = ends[r] >= bstart + bs
        if inside.all():
            return self._run_digest(first.view(np.uint64))
        c = np.empty((self._LANES, n), dtype=np.uint64)
        c[:, inside] = self._run_digest(first[inside].view(np.uint64))
        across = np.flatnonzero(~inside)
        pos = bstart[across, None] + np.arange(bs, dtype=np.int64)
        ri = np.searchsorted(ends, pos, side="right")
        c[:, across] = self._token_digest((starts[ri] + (pos - offs[ri])).view(np.uint64))
        return c

    def _chain_runs(
        self,
        starts: np.ndarray,
        lengths: np.ndarray,
        n: int,
        state: tuple[int, int],
        extras: Sequence[tuple[Any, ...] | None] | None,
    ) -> tuple[list[BlockHash], tuple[int, int]]:
        """Hash ``n`` full blocks of tokens given as runs, continuing the chain from ``state``: the
        compiled chain when it is built and there are no extra keys, else numpy (same keys)."""
        if extras is None and _chain_runs is not None and self.compiled:
            return _chain_runs(starts, lengths, n, self.block_size, self._run_keys, self._pos_key, self._pos_mult,
                               self._lane_keys, self._p, state[0], state[1])
        return self._chain(self._runs_digest(starts, lengths, n), state, extras)

    def _chain_blocks(
        self,
        tokens: np.ndarray,
        state: tuple[int, int],
        extras: Sequence[tuple[Any, ...] | None] | None,
    ) -> tuple[list[BlockHash], tuple[int, int]]:
        """Hash ``len(tokens) // bs`` full blocks continuing the chain from ``state``."""
        bs = self.block_size
        n = len(tokens) // bs
        blocks = np.ascontiguousarray(tokens[: n * bs], dtype=np.int64).view(np.uint64).reshape(n, bs)
        return self._chain(self._token_digest(blocks), state, extras)

    def _chain(
        self,
        c: np.ndarray,
        state: tuple[int, int],
        extras: Sequence[tuple[Any, ...] | None] | None,
    ) -> tuple[list[BlockHash], tuple[int, int]]:
        """Chain the block digests ``c`` ``(2, n)`` (extra keys mixed in) from ``state``."""
        n = c.shape[1]
        if extras is not None:
            by_extra: dict[tuple[Any, ...], list[int]] = {}
            for i, extra in enumerate(extras):
                if extra is not None:
                    by_extra.setdefault(extra, []).append(i)
            for extra, idx in by_extra.items():
                c[:, idx] = _splitmix64(c[:, idx] ^ self._extra_digest(extra)[:, None])
        pw, ipw = self._powers(n)
        # h_k = P^(k+1) * h_prev + P^k * sum_{j<=k} c_j * P^-j   (mod 2^64, per lane)
        prefix = np.cumsum(c * ipw[:, :n], axis=1, dtype=np.uint64)
        prev = np.array(state, dtype=np.uint64)[:, None]
        raw = pw[:, 1 : n + 1] * prev + pw[:, :n] * prefix
        final = _splitmix64(raw)
        keys = np.ascontiguousarray(final.T).view("V16").ravel().tolist()
        new_state = (int(raw[0, -1]), int(raw[1, -1])) if n else state
        return keys, new_state

    def hash_new_blocks(self, request: Request) -> list[BlockHash]:
        bs = self.block_size
        done = len(request.block_hashes)  # blocks hashed so far
        n_blocks = (request.num_tokens - self.num_lookahead_tokens) // bs - done
        if n_blocks <= 0:
            return []
        start = done * bs
        if request.unique_outputs:
            # Blocks holding a simulator-generated token can only ever match the same request's
            # own blocks (generated ids are unique and never appear in prompts), so a key unique
            # to (request, block index) has exactly the equality structure of the true hash.
            n_prompt = request.num_prompt_tokens // bs - done  # blocks of prompt tokens only
            tag = _GEN_TAG + request.uid.to_bytes(6, "big")
            if n_prompt <= 0:  # a decode's block boundary: every new block holds a generated token
                return [tag + i.to_bytes(6, "big") for i in range(done, done + n_blocks)]
            gen_keys = [tag + i.to_bytes(6, "big") for i in range(done + n_prompt, done + n_blocks)]
            if n_prompt < n_blocks:
                n_blocks = n_prompt
        else:
            gen_keys = []
        extras = blocks_extra_keys(request.lora_name, request.cache_salt, request.mm_features, start, n_blocks, bs,
                                   self.mm_resume_from_last, self.tagged_extra_keys)
        state = request.hash_state if request.block_hashes else self.initial_state
        end = start + n_blocks * bs  # a prompt's first hashing takes its runs uncut (same keys)
        uncut = start == 0 and end <= request.num_prompt_tokens
        runs = request.prompt_runs() if uncut else request.token_runs(start, end)
        if runs is not None:
            keys, request.hash_state = self._chain_runs(runs[0], runs[1], n_blocks, state, extras)
        else:
            tokens = request.token_slice(start, end)
            keys, request.hash_state = self._chain_blocks(tokens, state, extras)
        if self.num_lookahead_tokens:  # fold in each block's lookahead key (sim.core.lookahead_hashing)
            keys = fold(keys, lookahead_extra_keys(request, start, n_blocks, bs, self.num_lookahead_tokens))
        return keys + gen_keys if gen_keys else keys

    def prompt_external_hashes(self, request: Request) -> tuple[list[BlockHash], array[int], tuple[int, int]] | None:
        """In the one case where ``hash_new_blocks`` takes the compiled chain from block 0 (prompt as
        runs, no extra keys, no lookahead): equal to converting ``block_hashes`` (a test)."""
        bs, n_blocks = self.block_size, request.num_prompt_tokens // self.block_size
        if (_chain_runs_external is None or not self.compiled or self.num_lookahead_tokens or n_blocks <= 0
                or request.num_tokens != request.num_prompt_tokens or blocks_extra_keys(
                    request.lora_name, request.cache_salt, request.mm_features, 0, n_blocks, bs) is not None
                or (runs := request.prompt_runs()) is None):
            return None
        return _chain_runs_external(runs[0], runs[1], n_blocks, bs, self._run_keys, self._pos_key, self._pos_mult,
                                    self._lane_keys, self._p, *self.initial_state)

    def hash_token_blocks(
        self, tokens: Sequence[int] | np.ndarray, extra_keys: Sequence[tuple[Any, ...] | None] | None = None
    ) -> list[BlockHash]:
        """(Also takes a ``LazyTokens`` offering ``runs()``: hashed from its runs, same keys.)"""
        get_runs = getattr(tokens, "runs", None) if not isinstance(tokens, np.ndarray) else None
        runs = get_runs() if get_runs is not None else None
        n = len(tokens) // self.block_size
        extras = list(extra_keys[:n]) if extra_keys is not None else None
        if runs is not None:
            keys, _ = self._chain_runs(runs[0], runs[1], n, self.initial_state, extras)
            return keys
        keys, _ = self._chain_blocks(np.asarray(tokens, dtype=np.int64), self.initial_state, extras)
        return keys


def make_block_hasher(
    algo: str, block_size: int, hash_seed: int | str = 0, num_lookahead_tokens: int = 0,
    mm_resume_from_last: bool = True, tagged_extra_keys: bool = False,
) -> BlockHasher:
    """The hasher for ``prefix_caching_hash_algo=algo`` (``fast`` is this project's own);
    ``mm_resume_from_last=False`` and ``tagged_extra_keys=True``: vLLM 0.33.0's resumed multimodal
    scan and tagged extra keys (``sim.core.extra_keys``)."""
    h: BlockHasher
    if algo == "fast":
        h = FastBlockHasher(block_size, hash_seed, num_lookahead_tokens)
    elif algo in EXACT_HASH_FUNCTIONS:
        h = ExactBlockHasher(algo, block_size, hash_seed, num_lookahead_tokens)
    else:
        raise ValueError(f"unknown hash algorithm {algo!r}; choose one of {HASH_ALGOS}")
    h.mm_resume_from_last = mm_resume_from_last  # (a resumed scan only: not in prompt_key)
    h.tagged_extra_keys = tagged_extra_keys
    h.prompt_key = (algo, block_size, str(hash_seed), num_lookahead_tokens, tagged_extra_keys)  # (seeds as hashed)
    return h


def external_block_hash(block_hash: bytes) -> int:
    """vLLM's event form of a hash: the low 64 bits of the bytes read big-endian."""
    return int.from_bytes(block_hash, "big") & _MASK64
