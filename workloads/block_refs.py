"""The block reference string of a request stream at one block size (mirrors nothing in vLLM: the
input of the offline references of ``workloads.bounds``).

**What it holds.** A request's block keys are its chained full-block hashes with vLLM's equality
structure (``sim.core.hashing.FastBlockHasher``; extra keys from
:func:`sim.core.hashing.blocks_extra_keys`, the function the engine's hashers call), over what vLLM
computes and caches; :class:`BlockReferences` numbers them densely (equal keys, equal ids) and
records per request where its keys start, how many there are and how many its lookup may hit
(``workloads.bounds`` explains the model).

**Two ways to build it, the same equality of blocks.** Where ``workloads.bounds_scan`` is built, one
compiled pass (``stream_ids``) makes a 128-bit chained key per block straight from each request's
token runs (a Mooncake prompt's runs of consecutive ids are never expanded: a block of consecutive
ids is digested from its first id, others token by token) and numbers them by first appearance
through an open-addressing table, probing each slot a few blocks after asking the memory for it. No
Python object is made per block: on the first 4,000 Mooncake requests (3.3 M references) it takes
about a tenth of a second, against more than a second for the engine hasher's bytes keys sorted into
ranks (``compiled=False``, the oracle the tests compare it with block for block). The ids of the two
differ only in their numbering, so every policy counts the same hits; the first-appearance numbering
also gives a request's new blocks neighbouring ids, which keeps the policies' arrays local in memory
(the sequential LRU ran several times faster on it).

Invariants: both ways see the keys of :func:`request_block_keys` (the same blocks, lookup caps and
extra keys). Imports sim.core only (neither simpy nor torch).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sim.core.hashing import BlockHash, FastBlockHasher, blocks_extra_keys
from sim.core.request import token_array
from workloads.trace_format import TraceRequest

try:  # the compiled reference pass (same equality of blocks; built by pip install -e .)
    from workloads import bounds_scan as _scan
except ImportError:  # pragma: no cover - where the extension is not built
    _scan = None  # type: ignore[assignment]

_KEY_BYTES = 16  # FastBlockHasher keys are 128-bit


def request_block_keys(
    req: TraceRequest, hasher: FastBlockHasher, prompt: np.ndarray | None, include_outputs: bool = True
) -> tuple[list[BlockHash], int]:
    """``req``'s chain of cached full-block keys and how many leading ones its lookup may hit
    (``prompt``: its expanded prompt tokens; None: expanded here only when needed -- a prompt of
    runs of consecutive ids with no outputs to append is hashed from its runs, as the engine's
    hasher does, with the same keys). Pure."""
    bs = hasher.block_size
    outputs = include_outputs and req.output_token_ids is not None and req.output_tokens > 1
    if prompt is None and not outputs:
        runs = getattr(req.tokens, "runs", None)
        if runs is not None and runs() is not None:  # LazyTokens of runs: never expanded
            n = len(req.tokens)
            n_full = n // bs
            if n_full == 0:
                return [], 0
            extras = blocks_extra_keys(req.lora, req.salt, (), 0, n_full, bs)
            keys = hasher.hash_token_blocks(req.tokens, extras)  # type: ignore[arg-type]  # takes a LazyTokens too
            return keys, 0 if req.prompt_logprobs else min(len(keys), max(0, (n - 1) // bs))
    if prompt is None:
        prompt = token_array(req.tokens)
    n = int(prompt.size)
    cached = prompt
    if outputs:
        assert req.output_token_ids is not None
        outs = np.asarray(req.output_token_ids[: req.output_tokens - 1], dtype=np.int64)
        cached = np.concatenate([prompt, outs])
    n_full = int(cached.size) // bs
    if n_full == 0:
        return [], 0
    keys = hasher.hash_token_blocks(cached[: n_full * bs], blocks_extra_keys(req.lora, req.salt, (), 0, n_full, bs))
    return keys, 0 if req.prompt_logprobs else min(len(keys), max(0, (n - 1) // bs))


@dataclass
class BlockReferences:
    """The block reference string of a request stream at one block size.

    ``ids[start[r]:start[r] + length[r]]`` are request ``r``'s block keys (dense ints, chain order);
    its first ``lookup[r]`` of them are looked up; ``prompt_tokens`` is the sum of prompt lengths;
    ``prompt_blocks[r]`` of its keys are full prompt blocks and ``reads_cache[r]`` is False for a
    ``prompt_logprobs`` request (both for ``workloads.tier_bounds``; None when built by hand).
    """

    block_size: int
    ids: np.ndarray  # int64, one per block reference
    start: np.ndarray  # int64, per request
    length: np.ndarray  # int64, per request
    lookup: np.ndarray  # int64, per request
    prompt_tokens: int
    prompt_blocks: np.ndarray | None = None  # int64, per request
    reads_cache: np.ndarray | None = None  # bool, per request

    @property
    def num_requests(self) -> int:
        return int(self.start.size)

    @property
    def num_references(self) -> int:
        return int(self.ids.size)

    @property
    def num_distinct_blocks(self) -> int:
        return int(self.ids.max()) + 1 if self.ids.size else 0

    def next_lookup(self, *, compiled: bool = True) -> np.ndarray:
        """For each reference position ``p``: the position of the next *lookup* reference of the
        same block after ``p`` (``num_references`` when there is none); ``compiled=False``: the
        numpy code (the oracle) even where the compiled scan is built."""
        if compiled and _scan is not None:
            return _scan.next_lookups(*_arrays(self))
        n = self.ids.size
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        is_lookup = np.zeros(n, dtype=bool)
        owner = np.repeat(np.arange(self.start.size), self.length)
        offset = np.arange(n, dtype=np.int64) - self.start[owner]
        is_lookup[offset < self.lookup[owner]] = True
        pos = np.arange(n, dtype=np.int64)
        order = np.lexsort((pos, self.ids))  # by block, then position
        grp = self.ids[order]
        big = np.int64(n + 1)
        val = grp * big + np.where(is_lookup[order], order, n)  # position or "none" (n), per group
        # suffix minimum, then shift by one: the smallest lookup position strictly after each one
        suffix = np.minimum.accumulate(val[::-1])[::-1]
        after = np.empty(n, dtype=np.int64)
        after[:-1] = suffix[1:]
        after[-1] = (grp[-1] + 1) * big  # nothing after the last element
        same = (after // big) == grp
        nxt_sorted = np.where(same, after - grp * big, n)
        out = np.empty(n, dtype=np.int64)
        out[order] = nxt_sorted
        return out


def block_references(
    requests: Iterable[TraceRequest], block_size: int, *, include_outputs: bool = True, compiled: bool = True
) -> BlockReferences:
    """Hash every request's blocks (:func:`request_block_keys`) into a :class:`BlockReferences`;
    where ``workloads.bounds_scan`` is built (and ``compiled``) its ``stream_ids`` computes the keys
    and ids from the token runs in one compiled pass (ids by first appearance, the same equality of
    blocks: the same hit counts), else the engine's hasher and :func:`_dense_ids` (the oracle)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if compiled and _scan is not None:
        return _compiled_references(requests, block_size, include_outputs)
    hasher = FastBlockHasher(block_size)
    chunks: list[bytes] = []
    lengths: list[int] = []
    lookups: list[int] = []
    prompt_blocks: list[int] = []
    reads: list[bool] = []
    prompt_tokens = 0
    for req in requests:
        n_prompt = len(req.tokens)
        prompt_tokens += n_prompt
        keys, lookup = request_block_keys(req, hasher, None, include_outputs)
        lengths.append(len(keys))
        lookups.append(lookup)
        prompt_blocks.append(min(len(keys), n_prompt // block_size))
        reads.append(not req.prompt_logprobs)
        chunks.extend(keys)
    ids = _dense_ids(np.frombuffer(b"".join(chunks), dtype=f"S{_KEY_BYTES}"))
    return _assembled(block_size, ids, lengths, lookups, prompt_tokens, prompt_blocks, reads)


def _assembled(block_size: int, ids: np.ndarray, lengths: list[int], lookups: list[int], prompt_tokens: int,
               prompt_blocks: list[int], reads: list[bool]) -> BlockReferences:
    length = np.asarray(lengths, dtype=np.int64)
    start = np.zeros(length.size, dtype=np.int64)
    if length.size:
        start[1:] = np.cumsum(length)[:-1]
    return BlockReferences(block_size, ids, start, length, np.asarray(lookups, dtype=np.int64), prompt_tokens,
                           np.asarray(prompt_blocks, dtype=np.int64), np.asarray(reads, dtype=bool))


def _extra_digests(req: TraceRequest, n_full: int, block_size: int) -> tuple[list[int], bool, bool]:
    """The digests (two 64-bit lanes each) of ``req``'s extra keys on block 0 and on later blocks,
    from :func:`blocks_extra_keys` (the engine's one definition), and whether each applies."""
    extras = blocks_extra_keys(req.lora, req.salt, (), 0, min(n_full, 2), block_size)
    lanes = [0, 0, 0, 0]
    on = [False, False]
    for i, extra in enumerate(extras or ()):
        if extra is not None:
            d = hashlib.blake2b(pickle.dumps(extra, protocol=4), digest_size=16).digest()
            lanes[2 * i], lanes[2 * i + 1] = int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")
            on[i] = True
    return lanes, on[0], on[1]


def _compiled_references(requests: Iterable[TraceRequest], block_size: int, include_outputs: bool) -> BlockReferences:
    """:func:`block_references` through ``bounds_scan.stream_ids``: each request's cached tokens as
    runs (a prompt of runs as it is, expanded ids as runs of one), the keys made in C."""
    starts: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    req_run = [0]
    lengths: list[int] = []
    lookups: list[int] = []
    prompt_blocks: list[int] = []
    reads: list[bool] = []
    extra_lanes: list[list[int]] = []
    extra_on: list[bool] = []
    prompt_tokens = 0
    for req in requests:
        n_prompt = len(req.tokens)
        prompt_tokens += n_prompt
        get_runs = getattr(req.tokens, "runs", None)
        runs = get_runs() if get_runs is not None else None
        if runs is None:
            tokens = token_array(req.tokens)
            runs = (tokens, np.ones(tokens.size, dtype=np.int64))
        n_cached = n_prompt
        if include_outputs and req.output_token_ids is not None and req.output_tokens > 1:
            outs = np.asarray(req.output_token_ids[: req.output_tokens - 1], dtype=np.int64)
            runs = (np.concatenate([runs[0], outs]), np.concatenate([runs[1], np.ones(outs.size, dtype=np.int64)]))
            n_cached += int(outs.size)
        n_full = n_cached // block_size
        starts.append(runs[0])
        lens.append(runs[1])
        req_run.append(req_run[-1] + int(runs[0].size))
        lanes, on0, on1 = _extra_digests(req, n_full, block_size) if req.lora is not None or req.salt else (
            [0, 0, 0, 0], False, False)
        extra_lanes.append(lanes)
        extra_on += (on0, on1)
        lengths.append(n_full)
        lookups.append(0 if req.prompt_logprobs else min(n_full, max(0, (n_prompt - 1) // block_size)))
        prompt_blocks.append(min(n_full, n_prompt // block_size))
        reads.append(not req.prompt_logprobs)
    total = sum(lengths)
    if total >= 2**31 - 1:  # the compiled table holds int32 ids (34 G tokens at block 16: memory ends first)
        raise ValueError(f"{total} block references: more than the compiled reference pass numbers (2**31)")
    empty = np.zeros(0, dtype=np.int64)
    ids = _scan.stream_ids(
        np.ascontiguousarray(np.concatenate(starts) if starts else empty, dtype=np.int64),
        np.ascontiguousarray(np.concatenate(lens) if lens else empty, dtype=np.int64),
        np.asarray(req_run, dtype=np.int64), np.asarray(lengths, dtype=np.int64),
        np.asarray(extra_lanes, dtype=np.uint64).reshape(-1, 4), np.asarray(extra_on, dtype=np.int8),
        block_size, total)
    return _assembled(block_size, ids, lengths, lookups, prompt_tokens, prompt_blocks, reads)


def _dense_ids(raw: np.ndarray) -> np.ndarray:
    """Each 16-byte key's rank among the distinct keys in byte order (``np.unique``'s inverse),
    sorting the keys read as two big-endian 64-bit halves (byte order = numeric order of the
    halves): by the first half alone when equal first halves always come with equal second ones
    (distinct 128-bit hashes practically never share 64 bits), else by both. Several times faster
    than sorting 16-byte strings."""
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    halves = np.frombuffer(raw.tobytes(), dtype=">u8").reshape(-1, 2)
    hi, lo = halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)
    order = np.argsort(hi)
    same_hi = hi[order[1:]] == hi[order[:-1]]
    new_lo = lo[order[1:]] != lo[order[:-1]]
    if (same_hi & new_lo).any():  # two keys share their first half: order by both halves
        order = np.lexsort((lo, hi))
        same_hi = hi[order[1:]] == hi[order[:-1]]
        new_lo = lo[order[1:]] != lo[order[:-1]]
    new = np.empty(order.size, dtype=bool)
    new[0] = True
    new[1:] = ~same_hi | new_lo
    ids = np.empty(order.size, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _arrays(refs: BlockReferences) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The reference string as the compiled loops take it (contiguous int64)."""
    return (np.ascontiguousarray(refs.ids, dtype=np.int64), np.ascontiguousarray(refs.start, dtype=np.int64),
            np.ascontiguousarray(refs.length, dtype=np.int64), np.ascontiguousarray(refs.lookup, dtype=np.int64),
            refs.num_distinct_blocks)
