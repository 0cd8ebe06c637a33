"""The ids each chunk written ahead by this process sends, kept from its write-ahead until its
task's draining starts (thread side, a part of :class:`~.journal.Journal`).

When a task's draining starts the pagers need the ids written to it (a result under any other
id is none of ours). They are in the state (each chunk's id list beside its body), and reading
them back costs decoding every id again into a new string and hashing it: ~790 instructions an
image, ~1.5% of a run. The chunks this process wrote ahead had those very ids in a list (their
strings hashed already): :class:`SentIds` keeps that list by chunk id, and a task whose every
chunk is kept takes its ids from here, not from the state.

Safe because the state still says which chunks are the task's (one read of its chunk ids and
states, which the refusal marks need anyway): only the list of a chunk is kept, never which
task it went to, so a chunk moved to another task, detached, split or resolved is read as the
state says. A chunk's ids never change once written ahead (a split writes new chunks), and the
list kept is the one encoded into the chunk's id list (and body), so both read the same ids. A
task with any chunk not kept (written by an earlier process: a resume; a split's halves) reads
them all from the state, as before. A chunk deleted from the state with its list never taken
(its task drained unread: gone before it was done) leaves its id free, and SQLite gives it to
the next chunk written: every chunk written by this process replaces or drops the list under
its id (:meth:`SentIds.keep`), so a list is only ever its own chunk's.

Memory: a list is dropped when its task's ids are taken (the usual end), when its chunk is
replaced by a resend or split, and otherwise by a sweep that keeps only the chunks the state still
holds unresolved (run when the lists kept double). And at most :data:`KEEP_IDS` ids are kept
at a time: ``fashiontag run`` does not bound the rows in flight (a slow service, a big
catalogue: every row may be sent before the first task is done), and peak memory must not
grow with the manifest; a chunk written ahead past that many is not kept (its task reads its
ids from the state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["KEEP_IDS", "SWEEP_MIN", "SentIds"]

#: Ids kept at most at a time (~4 MB for ids of 30 characters).
KEEP_IDS = 50_000

#: Chunks kept before the first sweep (each later one at twice what the last one left).
SWEEP_MIN = 256


class SentIds:
    """Chunk id -> the ids it sends, for chunks written ahead by this process (see the
    module docstring). ``live`` gives the ids of the chunks the state holds unresolved from a
    given chunk id on (the sweep's question)."""

    def __init__(self, live: Callable[[int], Iterable[int]]) -> None:
        self._live = live
        self._by_chunk: dict[int, Sequence[str]] = {}
        self._sweep_at = SWEEP_MIN
        #: Ids in the lists kept.
        self._ids = 0
        #: Ids kept at most (an instance attribute: a test lowers it).
        self.cap = KEEP_IDS

    def __len__(self) -> int:
        return len(self._by_chunk)

    def keep(self, chunk_id: int, ids: Sequence[str] | None, replaces: int | None = None) -> None:
        """Keep the ids of a chunk just written ahead (``replaces``: the chunk it resolved;
        ``ids`` None: not kept, as a split's halves are not)."""
        by_chunk = self._by_chunk
        if replaces is not None and (gone := by_chunk.pop(replaces, None)) is not None:
            self._ids -= len(gone)
        # A list under this chunk id is a chunk's that is gone from the state (its task
        # drained unread: answered 410 before it was done), the id given again by SQLite:
        # never this chunk's ids.
        if (stale := by_chunk.pop(chunk_id, None)) is not None:
            self._ids -= len(stale)
        if ids is None or self._ids + len(ids) > self.cap:
            return  # (its task reads its ids from the state)
        by_chunk[chunk_id] = ids
        self._ids += len(ids)
        if len(by_chunk) >= self._sweep_at:
            self.sweep()

    def drop(self, chunk_id: int) -> None:
        """Forget a chunk's list (it was split: its halves, not kept, carry its ids)."""
        if (gone := self._by_chunk.pop(chunk_id, None)) is not None:
            self._ids -= len(gone)

    def take(self, chunks: Sequence[tuple[int, str]]) -> list[Sequence[str]] | None:
        """The id lists of a task's unresolved chunks, given every chunk of the task as
        (chunk id, state); None when one of them is not kept (then read them all from the
        state). Every chunk's list is dropped: a task's ids are taken once."""
        pop = self._by_chunk.pop
        kept = [(pop(chunk_id, None), state) for chunk_id, state in chunks]
        self._ids -= sum(len(ids) for ids, _ in kept if ids is not None)
        if any(ids is None and state != "resolved" for ids, state in kept):
            return None
        return [ids for ids, state in kept if state != "resolved" and ids is not None]

    def sweep(self) -> None:
        """Drop the lists of chunks the state no longer holds unresolved."""
        by_chunk = self._by_chunk
        if by_chunk:
            live = set(self._live(min(by_chunk)))
            self._by_chunk = {c: ids for c, ids in by_chunk.items() if c in live}
            self._ids = sum(map(len, self._by_chunk.values()))
        self._sweep_at = max(SWEEP_MIN, 2 * len(self._by_chunk))
