"""The scheduler's waiting queue (mirrors ``FCFSRequestQueue`` / ``PriorityRequestQueue`` of vLLM
0.25.1's ``vllm/v1/core/sched/request_queue.py``).

Invariants: FCFS pops in arrival order and ``prepend`` puts a preempted request at the head;
priority pops the minimum of ``Request.__lt__`` -- ``(priority, arrival_time, request_id)`` -- and
``prepend`` is a plain push (the heap order decides); iteration follows pop order. Imports
neither simpy nor torch.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from sim.core.request import Request


class RequestQueue(Protocol):
    """What the scheduler needs of its waiting queue."""

    def add(self, r: Request) -> None:
        """Changes state: enqueue a new request."""

    def prepend(self, r: Request) -> None:
        """Changes state: put a preempted request back (FCFS: at the head)."""

    def peek(self) -> Request:
        """Query: the next request to pop."""
        ...

    def pop_head(self) -> Request:
        """Changes state: remove and return the next request."""
        ...

    def remove_where(self, pred: Callable[[Request], bool]) -> None:
        """Changes state: drop every request matching ``pred``, keeping the others' order."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSRequestQueue(deque[Request]):
    """Arrival order; a preempted request goes back to the head."""

    def add(self, r: Request) -> None:
        self.append(r)

    def prepend(self, r: Request) -> None:
        self.appendleft(r)

    def peek(self) -> Request:
        return self[0]

    def pop_head(self) -> Request:
        return self.popleft()

    def remove_where(self, pred: Callable[[Request], bool]) -> None:
        keep = [r for r in self if not pred(r)]
        self.clear()
        self.extend(keep)


class PriorityRequestQueue:
    """Heap on ``Request.__lt__``: (priority, arrival_time, request_id); prepend = push."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add(self, r: Request) -> None:
        heapq.heappush(self._heap, r)

    def prepend(self, r: Request) -> None:
        heapq.heappush(self._heap, r)

    def peek(self) -> Request:
        return self._heap[0]

    def pop_head(self) -> Request:
        return heapq.heappop(self._heap)

    def remove_where(self, pred: Callable[[Request], bool]) -> None:
        self._heap = [r for r in self._heap if not pred(r)]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted(self._heap))


def create_request_queue(policy: Literal["fcfs", "priority"]) -> RequestQueue:
    """The waiting queue for a scheduling policy (vLLM ``create_request_queue``)."""
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
