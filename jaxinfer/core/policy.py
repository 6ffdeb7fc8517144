"""Scheduling policies: the order of the waiting queue and of preemption.

Both policies keep the running list ordered so that its last element is the
one to preempt first; the scheduler therefore never preempts a request it has
already scheduled in the same step (those come earlier in the list).

- ``fcfs``: waiting requests in arrival order, a preempted request goes back
  to the front; running requests in admission order, the latest admitted is
  preempted first.
- ``priority``: lower ``priority`` first, then earlier arrival; the running
  list is sorted the same way, so the lowest priority is preempted first.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
from collections.abc import Iterator

from ..request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._q: collections.deque[Request] = collections.deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        """Puts a preempted request back where it is served next."""
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityQueue:
    """A heap on (priority, arrival_time, insertion order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, Request]] = []
        self._seq = itertools.count()

    def add(self, req: Request) -> None:
        heapq.heappush(self._heap, (priority_key(req), next(self._seq), req))

    prepend = add  # a preempted request keeps its place by key

    def peek(self) -> Request:
        return self._heap[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[2] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[2] for e in sorted(self._heap, key=lambda e: e[:2]))


def priority_key(req: Request) -> tuple:
    return (req.priority, req.arrival_time)


class Policy:
    """What differs between policies: the waiting queue type and where an
    admitted request enters the running list."""

    def __init__(self, name: str):
        if name not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {name!r}")
        self.name = name

    def make_queue(self) -> FCFSQueue | PriorityQueue:
        return FCFSQueue() if self.name == "fcfs" else PriorityQueue()

    def admit(self, running: list[Request], req: Request) -> None:
        """Adds ``req`` to ``running`` keeping the preempt-last-first order."""
        if self.name == "fcfs":
            running.append(req)
        else:
            keys = [priority_key(r) for r in running]
            running.insert(bisect.bisect_right(keys, priority_key(req)), req)
