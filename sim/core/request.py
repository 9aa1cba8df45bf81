"""A request as the v1 scheduler sees it (mirrors ``vllm/v1/request.py`` of vLLM 0.25.1).

Invariants:

* ``num_tokens = num_prompt_tokens + len(output_token_ids)``; ``block_hashes`` always holds the
  hash of every *full* block of those tokens (recomputed on every append, like vLLM's
  ``update_block_hashes``), never of the partial tail block;
* ``num_computed_tokens`` advances at schedule time and is reset to 0 on preemption, while the
  output tokens (and therefore ``block_hashes``) are kept;
* ``skip_reading_prefix_cache`` is vLLM's default for sampling requests: ``prompt_logprobs`` set.

Output tokens come from the executor. Unless a trace supplies ``output_token_ids``, the simulator
generates ids ``GENERATED_TOKEN_BASE | uid << 24 | j`` that never occur in a prompt, which is what
lets the fast hasher key generated blocks cheaply (see ``sim.core.hashing``). Such consecutive ids
are held as a ``range`` (``output_token_ids`` is a ``range`` while every appended id continues
it, else a ``list``): a fast-forwarded decode appends a window's tokens without making an int each.

Imports only ``sim.core.lazy_tokens`` and ``sim.core.token_span`` from the project (the hasher is any
:class:`RequestBlockHasher`), neither simpy nor torch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from operator import add
from typing import Protocol

import numpy as np

from sim.core.lazy_tokens import LazyTokens
from sim.core.token_span import TokenSpan

GENERATED_TOKEN_BASE = 1 << 62
"""Prompt token ids must stay below this; simulator-generated output ids live above it."""
_MAX_OUTPUTS = 1 << 24
_NO_OUTPUTS = range(0)  # a request's outputs before its first token, when they will be generated


def _extend_range(outs: range, token_ids: int | Sequence[int]) -> list[int] | range:
    """``outs`` (a run of consecutive ids) followed by ``token_ids``: still a ``range`` when they
    continue it (or ``outs`` is empty and they are a run), else a list."""
    new: Sequence[int] = range(token_ids, token_ids + 1) if isinstance(token_ids, int) else token_ids
    if not new:
        return outs
    if type(new) is not range or new.step != 1:
        return [*outs, *new]
    if not outs:
        return new
    if new.start == outs.stop:
        return range(outs.start, new.stop)
    return [*outs, *new]


def generated_token_id(uid: int, j: int) -> int:
    """The j-th output token the simulator generates for the request with integer id ``uid``."""
    return GENERATED_TOKEN_BASE | (uid << 24) | j


@dataclass(frozen=True, slots=True)
class MMFeature:
    """A multimodal item's placeholder range in the prompt (vLLM's ``mm_position``) and identifier."""

    identifier: str
    offset: int
    length: int


class RequestBlockHasher(Protocol):
    """What a request needs of its block hasher (``sim.core.hashing.BlockHasher`` is one)."""

    block_size: int

    def hash_new_blocks(self, request: Request) -> list[bytes]:
        """The hashes of the request's full blocks not hashed yet (changes no state of the request)."""
        ...


def slice_runs(starts: np.ndarray, lengths: np.ndarray, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs ``(starts, lengths)`` cut to the tokens ``[start, end)`` (within their total length). Pure."""
    ends = np.cumsum(lengths)
    a = int(np.searchsorted(ends, start, side="right"))  # run holding token start
    b = int(np.searchsorted(ends, end - 1, side="right"))  # run holding token end - 1
    s = starts[a : b + 1].copy()
    n = lengths[a : b + 1].copy()
    cut = start - (int(ends[a - 1]) if a else 0)
    s[0] += cut
    n[0] -= cut
    n[-1] -= int(ends[b]) - end
    return s, n


def token_array(tokens: Sequence[int] | np.ndarray | LazyTokens) -> np.ndarray:
    """Token ids as an int64 array, expanding a :class:`LazyTokens`."""
    if not isinstance(tokens, np.ndarray) and hasattr(tokens, "materialize"):  # a LazyTokens
        return tokens.materialize()
    return np.asarray(tokens, dtype=np.int64)


def _checked_prompt(request_id: str, prompt: np.ndarray) -> np.ndarray:
    """Prompt ids must lie in [0, GENERATED_TOKEN_BASE): ids above are simulator outputs."""
    if prompt.size and (int(prompt.min()) < 0 or int(prompt.max()) >= GENERATED_TOKEN_BASE):
        raise ValueError(f"request {request_id}: prompt token ids must be in [0, 2**62)")
    return prompt


class RequestStatus(enum.IntEnum):
    """vLLM's ``RequestStatus`` subset; anything after ``PREEMPTED`` is finished.
    ``WAITING_FOR_REMOTE_KVS`` (a waiting request whose CPU-tier load is in flight, vLLM 0.33.0's
    offload connector) is numbered 0 so the other members keep their values."""

    WAITING_FOR_REMOTE_KVS = 0
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > PREEMPTED


# The same members as module globals, for the per-request hot paths: on CPython 3.11 reading a
# member through its class (``RequestStatus.RUNNING``) costs about 145 ns against 15 ns for a
# global (3.11's EnumType defines ``__getattr__``, so every attribute read on an enum class takes
# the slot-wrapper lookup path), and a plain step compares a few statuses per running request.
WAITING = RequestStatus.WAITING
RUNNING = RequestStatus.RUNNING
PREEMPTED = RequestStatus.PREEMPTED
FINISHED_LENGTH_CAPPED = RequestStatus.FINISHED_LENGTH_CAPPED
FINISHED_ABORTED = RequestStatus.FINISHED_ABORTED
WAITING_FOR_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS


class Request:
    """One inference request. ``uid`` is a small unique int (the trace position)."""

    __slots__ = (
        "request_id",
        "uid",
        "_prompt",
        "_prompt_source",
        "num_prompt_tokens",
        "num_tokens",
        "max_tokens",
        "arrival_time",
        "cache_salt",
        "lora_name",
        "lora_int_id",
        "priority",
        "prompt_logprobs",
        "skip_reading_prefix_cache",
        "mm_features",
        "output_token_plan",
        "unique_outputs",
        "status",
        "num_computed_tokens",
        "num_preemptions",
        "output_token_ids",
        "_block_hashes",
        "hash_state",
        "num_output_placeholders",
        "num_in_flight_tokens",
        "num_stale_output_tokens",
        "is_prefill_chunk",
        "_hasher",
        "_runs_checked",
        "num_external_computed_tokens",
        "num_steps_waiting_for_kv",
        "last_sched_seq",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray | LazyTokens,
        max_tokens: int,
        *,
        uid: int = 0,
        arrival_time: float = 0.0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_int_id: int = 0,
        priority: int = 0,
        prompt_logprobs: bool = False,
        mm_features: Sequence[MMFeature] = (),
        output_token_ids: Sequence[int] | np.ndarray | None = None,
        hasher: RequestBlockHasher | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"request {request_id}: output_tokens must be >= 1, got {max_tokens}")
        if max_tokens >= _MAX_OUTPUTS:
            raise ValueError(f"request {request_id}: output_tokens must be < {_MAX_OUTPUTS}")
        self.request_id = request_id
        self.uid = uid
        if not isinstance(prompt_token_ids, np.ndarray) and hasattr(prompt_token_ids, "materialize"):
            self._prompt: np.ndarray | None = None
            self._prompt_source: LazyTokens | None = prompt_token_ids
        else:
            self._prompt = _checked_prompt(request_id, np.asarray(prompt_token_ids, dtype=np.int64))
            self._prompt_source = None
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens  # prompt + outputs, kept in step with appends
        if self.num_prompt_tokens == 0:
            raise ValueError(f"request {request_id}: empty prompt")
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.cache_salt = cache_salt
        self.lora_name = lora_name
        self.lora_int_id = lora_int_id
        self.priority = priority
        self.prompt_logprobs = prompt_logprobs
        self.skip_reading_prefix_cache = prompt_logprobs
        self.mm_features = tuple(sorted(mm_features, key=lambda f: f.offset))
        self.output_token_plan = (
            None if output_token_ids is None else np.asarray(output_token_ids, dtype=np.int64)
        )
        if self.output_token_plan is not None and len(self.output_token_plan) < max_tokens:
            raise ValueError(
                f"request {request_id}: output_token_ids has {len(self.output_token_plan)} ids "
                f"but output_tokens is {max_tokens}"
            )
        self.unique_outputs = self.output_token_plan is None
        self.status = WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.output_token_ids: list[int] | range = _NO_OUTPUTS if self.unique_outputs else []
        self._block_hashes: list[bytes] | None = None  # computed on first use (see block_hashes)
        self.hash_state: tuple[int, int] = (0, 0)
        self.num_output_placeholders = 0
        # vLLM 0.33 Request: tokens scheduled whose step's output is not processed yet, and the share
        # of them that a preemption made stale (sim.core.scheduler, profile.stale_output_skip)
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.is_prefill_chunk = False
        self._hasher = hasher
        self._runs_checked = False
        # the CPU offload tier (vLLM 0.33.0's connector path; 0 without one): the CPU-hit tokens
        # of the first admission, the schedule() steps spent in WAITING_FOR_REMOTE_KVS over all
        # loads, and the last step that scheduled it (async scheduling's deferred block frees)
        self.num_external_computed_tokens = 0
        self.num_steps_waiting_for_kv = 0
        self.last_sched_seq = 0

    # -- token views --------------------------------------------------------------------------
    @property
    def prompt_token_ids(self) -> np.ndarray:
        if self._prompt is None:
            assert self._prompt_source is not None
            self._prompt = _checked_prompt(self.request_id, self._prompt_source.materialize())
            self._prompt_source = None
        return self._prompt

    @property
    def block_hashes(self) -> list[bytes]:
        """Hashes of every full block of prompt + outputs.

        vLLM hashes the prompt when the request is created; here the prompt is hashed on first
        use (a lookup or a cache), which yields the same list -- hashes depend only on tokens and
        extra keys -- while requests queued but never looked up cost no memory for them.
        """
        if self._block_hashes is None:
            self._block_hashes = []
            if self._hasher is not None:
                self._block_hashes.extend(self._hasher.hash_new_blocks(self))
        return self._block_hashes

    def prompt_runs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Query: the whole prompt as runs of consecutive ids ``(starts, lengths)`` while it is
        still held as runs (never expanded), else None. The runs' ids are range-checked like an
        expanded prompt's. Do not mutate the arrays."""
        src = self._prompt_source
        get = getattr(src, "runs", None) if src is not None else None
        runs = get() if get is not None else None
        if runs is None:
            return None
        starts, lengths = runs
        if not self._runs_checked:
            # on Python ints: a prompt has a few runs, where numpy's per-call cost (9 us for these
            # three calls) dominates, and a run's end cannot wrap around as an int64 sum could
            first, n = starts.tolist(), lengths.tolist()
            if first and (min(first) < 0 or max(map(add, first, n)) > GENERATED_TOKEN_BASE):
                raise ValueError(f"request {self.request_id}: prompt token ids must be in [0, 2**62)")
            self._runs_checked = True
        return starts, lengths

    def token_runs(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Query: prompt tokens ``[start, end)`` as runs of consecutive ids ``(starts, lengths)``
        while the prompt is still held as runs (see ``prompt_runs``), else None (use ``token_slice``)."""
        if not start < end <= self.num_prompt_tokens:
            return None
        runs = self.prompt_runs()
        return None if runs is None else slice_runs(runs[0], runs[1], start, end)

    def token_slice(self, start: int, end: int) -> np.ndarray:
        """Tokens ``[start, end)`` of prompt + outputs as int64."""
        p = self.num_prompt_tokens
        if end <= p:
            return self.prompt_token_ids[start:end]
        sel = self.output_token_ids[max(0, start - p) : end - p]
        outs = np.arange(sel.start, sel.stop, dtype=np.int64) if type(sel) is range else np.asarray(sel, dtype=np.int64)
        if start >= p:
            return outs
        return np.concatenate([self.prompt_token_ids[start:p], outs])

    def token_span(self, start: int, end: int) -> TokenSpan:
        """Tokens ``[start, end)`` of prompt + outputs as a ``BlockStored`` carries them: equal to
        ``token_slice(start, end).tolist()``, made into ints only when read (``sim.core.token_span``);
        a view of the prompt array and a slice of the outputs (a ``range`` for generated ids)."""
        p = self.num_prompt_tokens
        prompt = self.prompt_token_ids[min(start, p) : min(end, p)]
        if end <= p:
            return TokenSpan(prompt, _NO_OUTPUTS)
        return TokenSpan(prompt, self.output_token_ids[max(0, start - p) : end - p])

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids.tolist() + list(self.output_token_ids)

    # -- outputs ------------------------------------------------------------------------------
    def planned_output_token(self, j: int) -> int:
        """The j-th output token this request will produce (trace-given or generated)."""
        if self.output_token_plan is not None:
            return int(self.output_token_plan[j])
        return generated_token_id(self.uid, j)

    def planned_output_tokens(self, start: int, count: int) -> Sequence[int]:
        """Output tokens ``start .. start + count - 1`` of the plan (see ``planned_output_token``):
        a ``range`` of generated ids, a list of trace-given ones."""
        if self.output_token_plan is not None:
            return self.output_token_plan[start : start + count].tolist()
        base = GENERATED_TOKEN_BASE | (self.uid << 24)
        return range(base + start, base + start + count)

    def append_planned_outputs(self, count: int) -> None:
        """Append the next ``count`` planned output tokens (``append_output_token_ids`` of
        ``planned_output_tokens``, as the decode fast-forward plays a window): a ``range`` of
        generated outputs is extended in place of building one for the new ids."""
        outs = self.output_token_ids
        if self.output_token_plan is None and type(outs) is range and outs and count > 0:
            stop = generated_token_id(self.uid, len(outs))
            if outs.stop == stop and outs.step == 1:
                self.output_token_ids = range(outs.start, stop + count)
                self._outputs_grew()
                return
        self.append_output_token_ids(self.planned_output_tokens(len(outs), count))

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens and hash any block they complete (vLLM ``update_block_hashes``).
        Ids continuing a ``range`` of outputs extend it; any other id turns it into a list."""
        outs = self.output_token_ids
        if type(outs) is range:
            if type(token_ids) is int and outs and token_ids == outs.stop:
                outs = range(outs.start, token_ids + 1)  # a decode step's sampled id, continuing the run
            else:
                outs = _extend_range(outs, token_ids)
            self.output_token_ids = outs
        elif isinstance(token_ids, int):
            outs.append(token_ids)
        else:
            outs.extend(token_ids)
        self._outputs_grew()

    def _outputs_grew(self) -> None:
        """After ``output_token_ids`` grew: recount ``num_tokens`` and hash the blocks completed."""
        self.num_tokens = n = self.num_prompt_tokens + len(self.output_token_ids)
        hashes = self._block_hashes
        if hashes is not None and self._hasher is not None and n >= (len(hashes) + 1) * self._hasher.block_size:
            hashes.extend(self._hasher.hash_new_blocks(self))

    def is_finished(self) -> bool:
        return self.status > PREEMPTED

    def release_tokens(self) -> None:
        """Drop token storage of a finished request (keeps replay memory bounded)."""
        self._prompt = np.empty(0, dtype=np.int64)
        self._prompt_source = None
        self.output_token_plan = None
        self.output_token_ids = []
        self._block_hashes = []
        self.num_prompt_tokens = self.num_tokens = 0

    def __lt__(self, other: Request) -> bool:
        """Priority-queue order, as vLLM: (priority, arrival_time, request_id)."""
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        return self.request_id < other.request_id

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={len(self.output_token_ids)}/{self.max_tokens}, computed={self.num_computed_tokens})"
        )
