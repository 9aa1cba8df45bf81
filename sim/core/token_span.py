"""The token ids of a ``BlockStored`` event, made into Python ints only when read.

vLLM's ``BlockStored`` carries the stored blocks' token ids as a list of ints
(``vllm/distributed/kv_events.py``). In a replay most events are only ever matched by their hashes
(a fleet's routers index ``block_hashes``), yet a list would turn every cached prompt token into a
Python int when the block is cached and free it again when the event is dropped (a 16-replica
fleet took 14 % less CPU with empty lists there, an upper bound measured side by side). A
:class:`TokenSpan` keeps what the ids are cut from instead -- a view of the request's int64 prompt
array and a slice of its outputs (a ``range`` for generated ids) -- and makes the list on first
read.

Invariants: a span is equal to the list of its ids (and to any other span or sequence of the same
ids, in order), has their length, iterates, indexes and prints as that list, and pickles and
deep-copies *as* that list (so ``dataclasses.asdict`` of an event, and hence ``kv_events.jsonl``,
holds a plain list). It never changes: a request's prompt array is never written in place (a
finished request's ``release_tokens`` replaces it, which leaves the view intact), and the outputs
part is a slice of its own. Unhashable, like a list. Imports only numpy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

_EMPTY = np.empty(0, dtype=np.int64)


class TokenSpan(Sequence[int]):
    """Token ids ``prompt`` (an int64 array, typically a view) followed by ``outputs``."""

    __slots__ = ("_prompt", "_outputs", "_list")

    def __init__(self, prompt: np.ndarray, outputs: Sequence[int]) -> None:
        self._prompt = prompt
        self._outputs = outputs
        self._list: list[int] | None = None

    def tolist(self) -> list[int]:
        """The ids as a list of Python ints (made once, then kept)."""
        if self._list is None:
            ids: list[int] = self._prompt.tolist()
            outs = self._outputs
            if len(outs):
                # a range makes its ints directly; a trace-given list may hold numpy integers
                ids.extend(outs if type(outs) is range else np.asarray(outs, dtype=np.int64).tolist())
            self._list = ids
            self._prompt = _EMPTY  # the list now holds them: keep no prompt array alive
            self._outputs = ()
        return self._list

    def __len__(self) -> int:
        if self._list is not None:
            return len(self._list)
        return len(self._prompt) + len(self._outputs)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.tolist()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenSpan):
            return len(self) == len(other) and self.tolist() == other.tolist()
        if isinstance(other, (list, tuple, range)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking like the list it stands for

    def __repr__(self) -> str:
        return repr(self.tolist())

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (self.tolist(),))

    def __deepcopy__(self, memo: dict[int, Any]) -> list[int]:
        return list(self.tolist())
