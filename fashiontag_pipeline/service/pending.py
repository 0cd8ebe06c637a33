"""The worker's queue of accepted images, one FIFO per key, served round-robin.

One key's thousands of slow images no longer hold up another key's one image: the worker takes
the head of the next key's queue in turn (see :class:`~.worker.TaggingWorker` for the per-key
share of fetch slots).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from .records import PendingRange

__all__ = ["PendingQueue"]


class PendingQueue:
    """Pending ranges per owner; :meth:`head` and :meth:`consume` rotate between owners."""

    def __init__(self) -> None:
        self._by_owner: dict[bytes, deque[PendingRange]] = {}
        self._order: deque[bytes] = deque()

    def __bool__(self) -> bool:
        return bool(self._order)

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_owner.values())

    def owners(self) -> set[bytes]:
        """The owners with pending images."""
        return set(self._by_owner)

    def append(self, item: PendingRange) -> None:
        owner = item[0].owner
        queue = self._by_owner.get(owner)
        if queue is None:
            queue = self._by_owner[owner] = deque()
            self._order.append(owner)
        queue.append(item)

    def head(self, busy: Mapping[bytes, int], share: int) -> PendingRange | None:
        """The oldest range of the first owner in turn with fewer than ``share`` images
        ``busy``; None when every owner has its share. Owners passed over keep their turn."""
        for owner in self._order:
            if busy.get(owner, 0) < share:
                return self._by_owner[owner][0]
        return None

    def consume(self, item: PendingRange, count: int) -> None:
        """Take ``count`` images from the start of ``item`` (a :meth:`head`), and move its owner
        to the back of the turn."""
        task, start, end, urls = item
        owner = task.owner
        queue = self._by_owner[owner]
        stop = start + count
        if stop >= end:
            queue.popleft()
        else:
            queue[0] = (task, stop, end, urls[count:] if urls else None)
        self._order.remove(owner)
        if queue:
            self._order.append(owner)
        else:
            del self._by_owner[owner]
