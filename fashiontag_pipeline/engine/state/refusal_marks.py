"""Where the service's refusals of a chunk's rows can begin in each job's rejects, kept from the
chunk's write-ahead until its task's read starts (thread side, a part of
:class:`~.journal.Journal`).

The service's refusals of a chunk's rows are written to the rejects after the chunk is written
ahead, so a task's read looks for them from the earliest mark of its chunks rather than from the
start of every job's rejects (a service that refused rows of every task made each task's read
scan every reject of the run: tasks x rejects).

A mark is forgotten when its task's read takes it (the usual end), when its chunk is split (a
write refused whole: the halves are read, never it) or replaced by a resend (a lost task's rows),
and otherwise by a sweep that keeps only the chunks the state still holds unresolved (rows sent
:data:`~..config.EngineConfig.max_sends` times and never returned, a task expired before it was
read), run when the marks kept double: a daemon whose manifests each had a write refused whole
kept a mark (a dict of every open job) for every one for its whole life. A task with a chunk
whose mark is gone is read from the start of the rejects, as one written by an earlier process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["SWEEP_MIN", "RefusalMarks"]

#: Marks kept before the first sweep (each later one at twice what the last one left).
SWEEP_MIN = 256


class RefusalMarks:
    """Chunk id -> {job: its rejects checkpoint} when the chunk was written ahead by this
    process. ``live`` gives the ids of the chunks the state holds unresolved from a given chunk
    id on (the sweep's question)."""

    def __init__(self, live: Callable[[int], Iterable[int]]) -> None:
        self._live = live
        self._by_chunk: dict[int, dict[int, int]] = {}
        #: Marks kept before the first sweep (an instance attribute: a test lowers it).
        self.sweep_min = SWEEP_MIN
        self._sweep_at = 0

    def __len__(self) -> int:
        return len(self._by_chunk)

    def keep(self, chunk_id: int, mark: dict[int, int], replaces: int | None = None) -> None:
        """Keep the mark of a chunk just written ahead (``replaces``: the chunk it resolved,
        whose mark goes)."""
        by_chunk = self._by_chunk
        if replaces is not None:
            by_chunk.pop(replaces, None)
        by_chunk[chunk_id] = mark
        if len(by_chunk) >= max(self._sweep_at, self.sweep_min):
            self.sweep()

    def drop(self, chunk_id: int) -> None:
        """Forget a chunk's mark (it was split: its halves carry its rows)."""
        self._by_chunk.pop(chunk_id, None)

    def take(self, chunk_ids: Sequence[int]) -> dict[int, int] | None:
        """The earliest checkpoint of each job over the marks of ``chunk_ids`` (a task's
        chunks), forgotten (a task is read once); None when one of them has no mark."""
        pop = self._by_chunk.pop
        marks = [pop(c, None) for c in chunk_ids]
        if not marks or any(m is None for m in marks):
            return None
        since: dict[int, int] = {}
        for mark in marks:
            assert mark is not None
            for job, at in mark.items():
                since[job] = min(at, since.get(job, at))
        return since

    def sweep(self) -> None:
        """Drop the marks of chunks the state no longer holds unresolved."""
        by_chunk = self._by_chunk
        if by_chunk:
            live = set(self._live(min(by_chunk)))
            self._by_chunk = {c: mark for c, mark in by_chunk.items() if c in live}
        self._sweep_at = 2 * len(self._by_chunk)
