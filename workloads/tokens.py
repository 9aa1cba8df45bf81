"""Compact prompts and the token-id layout shared by every loader and generator (mirrors nothing
in vLLM: content identifiers, not vocabulary ids).

Token ids here are *identifiers of content*, not vocabulary ids: two tokens are the same iff their
ids are equal, which is all prefix caching looks at. (A backend that runs a real model must fold
them into its vocabulary, e.g. ``id % vocab_size``.)

Id layout (all ids < 2**62, the simulator's prompt-id limit):

* Mooncake (``workloads.mooncake``) keeps its historical ids ``hash_id * 512 + k`` (< 2**40);
* everything else lives in *regions* of ``2**32`` ids: ``region(kind, index) = (kind << 24 | index)
  << 32`` with ``kind`` in ``[1, 64)`` naming a source or purpose (constants ``K_*`` below) and
  ``index`` in ``[0, 2**24)`` naming an item (a document, a session, a request). Distinct
  ``(kind, index)`` pairs never overlap, and no region overlaps the Mooncake range (kind >= 1 puts
  every region at or above 2**56).

:class:`RunTokens` stores a prompt as runs ``[start, start + length)`` of consecutive ids. Every
content item (a document, a message, a trace block id) expands to consecutive ids, so a 500k-token
agent prompt is a few hundred runs instead of a 4 MB array. Invariants: ``starts`` and ``lengths``
are int64 arrays of equal size, every length is >= 1, and ``len(self) == lengths.sum()``.

Imports neither simpy nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REGION_BITS = 32
"""Each region holds ``2**REGION_BITS`` ids."""
INDEX_BITS = 24
"""Up to ``2**INDEX_BITS`` items per kind."""

# Region kinds (never reuse a number for two purposes).
K_TEMPLATE = 1  # chat-template / marker tokens (index 0) and tenant tags (index 1)
K_RAGPULSE = 2  # RAGPulse component c -> region(K_RAGPULSE, 0) + c * 512 + k
K_AGENT_TRACE_SHARED = 3  # the canonical shared tool + system prompt of the agent trace
K_AGENT_TRACE_SESSION = 4  # one region per session file (local hash-id scope)
K_AGENT_TRACE_GLOBAL = 5  # hash_id_scope "global" traces
K_AZURE = 6  # one region per Azure request (unique content)
K_RAG_SHARED = 7  # synthetic RAG: system prompt (index 0)
K_RAG_DOC = 8  # synthetic RAG: one region per corpus document
K_RAG_QUESTION = 9  # synthetic RAG: one region per question
K_CHAT_SHARED = 10  # synthetic chat: system prompts (index = prompt number)
K_CHAT_SESSION = 11  # synthetic chat: one region per session
K_AGENT_SHARED = 12  # synthetic agent: tools + system prompt (0), sub-agent prompt (1)
K_AGENT_SESSION = 13  # synthetic agent: one region per session


def region(kind: int, index: int) -> int:
    """First id of region ``(kind, index)``; raises if either is out of range."""
    if not 1 <= kind < 64:
        raise ValueError(f"region kind must be in [1, 64), got {kind}")
    if not 0 <= index < (1 << INDEX_BITS):
        raise ValueError(f"region index must be in [0, 2**{INDEX_BITS}), got {index}")
    return ((kind << INDEX_BITS) | index) << REGION_BITS


# Chat-template markers (Llama-3 style), identical in every request that uses them.
_T = region(K_TEMPLATE, 0)
BOS = _T + 0
START_HEADER = _T + 1
END_HEADER = _T + 2
EOT = _T + 3
NEWLINES = _T + 4
ROLE = {"system": _T + 10, "user": _T + 11, "assistant": _T + 12, "tool": _T + 13}
DOC_MARK = _T + 20
RAG_TEMPLATE = _T + 100  # the ids RAGPulse's unlisted template tokens expand to
TENANT_TAG_BASE = region(K_TEMPLATE, 1)
"""Tenant ``t``'s tag token is ``TENANT_TAG_BASE + t`` (see ``workloads.tenants``)."""


def header(role: str) -> list[int]:
    """``<|start_header_id|>role<|end_header_id|>\\n\\n`` as 4 ids."""
    return [START_HEADER, ROLE[role], END_HEADER, NEWLINES]


class RunTokens:
    """A prompt as runs of consecutive token ids (a ``sim.core.request.LazyTokens``)."""

    __slots__ = ("starts", "lengths", "_len")

    def __init__(self, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.starts.shape != self.lengths.shape or self.starts.ndim != 1:
            raise ValueError("starts and lengths must be 1-d arrays of equal size")
        if self.lengths.size and int(self.lengths.min()) < 1:
            raise ValueError("run lengths must be >= 1")
        self._len = int(self.lengths.sum())

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def of(cls, *parts: RunTokens | tuple[int, int] | Sequence[int] | np.ndarray) -> RunTokens:
        """Concatenate parts: ``RunTokens``, ``(start, length)`` runs or explicit id lists."""
        starts: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for p in parts:
            if isinstance(p, RunTokens):
                starts.append(p.starts)
                lengths.append(p.lengths)
            elif isinstance(p, tuple):
                if p[1] > 0:
                    starts.append(np.array([p[0]], dtype=np.int64))
                    lengths.append(np.array([p[1]], dtype=np.int64))
            else:
                arr = np.asarray(p, dtype=np.int64)
                starts.append(arr)
                lengths.append(np.ones(arr.size, dtype=np.int64))
        if not starts:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64))
        return cls(*_merge(np.concatenate(starts), np.concatenate(lengths)))

    @classmethod
    def from_ids(cls, ids: np.ndarray, tokens_per_id: int, base: int, length: int | None = None) -> RunTokens:
        """Id ``h`` expands to ``base + h * tokens_per_id + k``, k < tokens_per_id; cut to ``length``."""
        ids = np.asarray(ids, dtype=np.int64)
        starts = base + ids * tokens_per_id
        lengths = np.full(ids.size, tokens_per_id, dtype=np.int64)
        out = cls(*_merge(starts, lengths))
        return out if length is None else out.prefix(length)

    @classmethod
    def from_id_list(cls, ids: Sequence[int], tokens_per_id: int, base: int, length: int) -> RunTokens:
        """:meth:`from_ids` cut to ``length``, the same runs, for a short list of Python ints (a
        Mooncake line's ~24 ids): built in one pass, without the dozen numpy calls whose fixed
        cost dominated per line. Ids ``h`` with ``h == previous + 1`` extend the current run."""
        starts: list[int] = []
        lengths: list[int] = []
        nxt = -1
        for h in ids:
            s = base + h * tokens_per_id
            if s == nxt:
                lengths[-1] += tokens_per_id
            else:
                starts.append(s)
                lengths.append(tokens_per_id)
            nxt = s + tokens_per_id
        excess = len(ids) * tokens_per_id - max(length, 0)
        while excess > 0 and lengths:  # cut to ``length`` from the end, as ``prefix``
            if lengths[-1] > excess:
                lengths[-1] -= excess
                break
            excess -= lengths.pop()
            starts.pop()
        out = cls.__new__(cls)
        out.starts = np.array(starts, dtype=np.int64)
        out.lengths = np.array(lengths, dtype=np.int64)
        out._len = sum(lengths)
        return out

    # -- views ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    dtype = np.dtype(np.int64)
    """The ids' dtype, as for an array (``np.asarray(runs)`` materializes)."""

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        out = self.materialize()
        return out if dtype is None else out.astype(dtype)

    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The runs ``(starts, lengths)`` (a ``sim.core.request.LazyTokens`` may offer them: the fast
        hasher digests a block inside one run from its first id alone)."""
        return self.starts, self.lengths

    def materialize(self) -> np.ndarray:
        """The token ids as one int64 array."""
        if not self._len:
            return np.empty(0, dtype=np.int64)
        offsets = np.cumsum(self.lengths) - self.lengths
        return np.repeat(self.starts - offsets, self.lengths) + np.arange(self._len, dtype=np.int64)

    def prefix(self, n: int) -> RunTokens:
        """The first ``n`` tokens (all of them if ``n >= len``)."""
        if n >= self._len:
            return self
        if n <= 0:
            return RunTokens(np.empty(0, np.int64), np.empty(0, np.int64))
        ends = np.cumsum(self.lengths)
        k = int(np.searchsorted(ends, n))  # run holding token n-1
        lengths = self.lengths[: k + 1].copy()
        lengths[k] -= int(ends[k]) - n
        return RunTokens(self.starts[: k + 1].copy(), lengths)

    def slice(self, start: int, end: int) -> RunTokens:
        """Tokens ``[start, end)`` (clipped to the prompt)."""
        head = self.prefix(end)
        start = max(0, start)
        if start == 0:
            return head
        if start >= len(head):
            return RunTokens(np.empty(0, np.int64), np.empty(0, np.int64))
        ends = np.cumsum(head.lengths)
        k = int(np.searchsorted(ends, start, side="right"))  # first run with tokens at >= start
        cut = start - (int(ends[k - 1]) if k else 0)
        starts = head.starts[k:].copy()
        lengths = head.lengths[k:].copy()
        starts[0] += cut
        lengths[0] -= cut
        return RunTokens(starts, lengths)

    @property
    def num_runs(self) -> int:
        return int(self.starts.size)

    def __repr__(self) -> str:
        return f"RunTokens({self._len} tokens in {self.num_runs} runs)"


def _merge(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fuse adjacent runs where one ends exactly where the next starts; drops empty runs."""
    keep = lengths > 0
    if not keep.all():
        starts, lengths = starts[keep], lengths[keep]
    if starts.size < 2:
        return starts, lengths
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] != starts[:-1] + lengths[:-1]
    idx = np.flatnonzero(new)
    return starts[idx], np.add.reduceat(lengths, idx)


class TaggedTokens:
    """``inner`` with one extra token ``tag`` inserted before position ``pos`` (lazy)."""

    __slots__ = ("inner", "pos", "tag")

    def __init__(self, inner: object, pos: int, tag: int) -> None:
        if not 0 <= pos <= len(inner):  # type: ignore[arg-type]
            raise ValueError(f"tag position {pos} outside the prompt of {len(inner)} tokens")  # type: ignore[arg-type]
        self.inner = inner
        self.pos = pos
        self.tag = tag

    def __len__(self) -> int:
        return len(self.inner) + 1  # type: ignore[arg-type]

    def materialize(self) -> np.ndarray:
        from sim.core.request import token_array

        return np.insert(token_array(self.inner), self.pos, self.tag)  # type: ignore[arg-type]

    def runs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The runs of ``inner`` with the tag's run inserted, when ``inner`` is a ``RunTokens``."""
        if not isinstance(self.inner, RunTokens):
            return None
        head, tail = self.inner.prefix(self.pos), self.inner.slice(self.pos, len(self.inner))
        return (np.concatenate([head.starts, [self.tag], tail.starts]),
                np.concatenate([head.lengths, [1], tail.lengths]))


class TokenSpace:
    """Hands out runs of never-used ids inside one region (``fresh(n)`` -> ``(start, n)``)."""

    __slots__ = ("base", "used")

    def __init__(self, base: int) -> None:
        self.base = base
        self.used = 0

    def fresh(self, n: int) -> tuple[int, int]:
        if n < 0 or self.used + n > (1 << REGION_BITS):
            raise ValueError(f"token region exhausted or bad length {n}")
        start = self.base + self.used
        self.used += n
        return start, n


def run_ids(run: tuple[int, int]) -> np.ndarray:
    """The ids of one ``(start, length)`` run as an int64 array."""
    return np.arange(run[0], run[0] + run[1], dtype=np.int64)
