"""Rows of a chunk of unknown fate counted as submitted when their task returns them.

A chunk becomes an orphan when its write's fate is unknown and its task takes no more writes
(an answer lost, then the retry refused, or the task expired meanwhile; a write in flight at a
kill): it is settled from the task's results (:class:`~.settle.TaskSettler`). Its rows the
task returns were taken by the service, and billed, as the rows of a write answered 202; they
are counted as ``submitted`` (engine-wide and per job) in the commit that writes their lines,
so that a job completed by that commit has them in its figures. The rows counted so far are
recorded in the chunk (``chunks.n_ok``, :func:`~.state.changes.chunk_counted`) in that same
transaction: a resume counts none twice and misses none. A chunk counted whole when it became
an orphan (a write answered 2xx with no body) is never counted again.

Only tasks with orphan chunks take this path (rarely): the usual page commit does no more
than look at :attr:`~.tracker.TaskEntry.orphans`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .answers import count_by_job
from .jobs import Jobs
from .pages import PageRow
from .policy import decode_body
from .state import Journal, changes
from .tracker import TaskEntry

__all__ = ["ReturnedRows"]


class _Orphan(msgspec.Struct):
    ids: list[str]
    positions: list[int]
    #: Indexes of its rows counted as submitted.
    counted: set[int] = msgspec.field(default_factory=set)


class ReturnedRows:
    """Counts the rows of orphan chunks their task returns (see the module docstring)."""

    def __init__(self, journal: Journal, jobs: Jobs) -> None:
        self.journal = journal
        self.jobs = jobs
        #: Orphan chunks read, by id (None: none such with a body, not asked for again).
        self._chunks: dict[int, _Orphan | None] = {}

    async def _load(self, entry: TaskEntry, chunk_ids: list[int]) -> None:
        """Read orphan chunks' rows, and which were counted: as many as ``n_ok`` says, those
        the task returned first (the rows its earlier commits counted), then the others (a
        chunk counted whole)."""
        seen = entry.seen or set()
        self._chunks.update(dict.fromkeys(chunk_ids))
        for chunk_id, n_ok, body in await self.journal.run(self.journal.db.orphan_rows, chunk_ids):
            rows = decode_body(body)
            ids = [request.context.id for _, request in rows]
            orphan = _Orphan(ids, [pos for pos, _ in rows])
            if n_ok:
                hits = [i for i, ident in enumerate(ids) if ident in seen]
                rest = [i for i, ident in enumerate(ids) if ident not in seen]
                orphan.counted = set((hits + rest)[:n_ok])
            self._chunks[chunk_id] = orphan

    async def commit(
        self,
        entry: TaskEntry,
        *,
        page: tuple[str | None, list[PageRow]] | None = None,
        ops: Sequence[changes.Change] = (),
        counters: dict[str, int] | None = None,
        all_success: bool = False,
    ) -> None:
        """:meth:`~.state.Journal.commit` of a page of the task's results (the task's
        ``seen`` already holds its ids), with the rows of the task's orphan chunks returned
        and not yet counted counted as submitted; with no page, those counts alone."""
        if not entry.orphans:
            if page is not None or ops:
                await self.journal.commit(
                    page=page, ops=ops, counters=counters, all_success=all_success
                )
            return
        orphans = sorted(entry.orphans)
        unread = [cid for cid in orphans if cid not in self._chunks]
        if unread:
            await self._load(entry, unread)
        seen = entry.seen or set()
        marks: list[changes.Change] = []
        counted: list[tuple[_Orphan, list[int]]] = []
        positions: list[int] = []
        for chunk_id in orphans:
            orphan = self._chunks.get(chunk_id)
            if orphan is None:
                continue
            new = [
                i for i, ident in enumerate(orphan.ids) if ident in seen and i not in orphan.counted
            ]
            if new:
                counted.append((orphan, new))
                positions.extend(orphan.positions[i] for i in new)
                marks.append(changes.chunk_counted(chunk_id, len(orphan.counted) + len(new)))
        if page is None and not ops and not marks:
            return
        totals = dict(counters or {})
        by_job: dict[int, dict[str, int]] = {}
        if positions:
            totals["submitted"] = totals.get("submitted", 0) + len(positions)
            by_job = {
                job: {"submitted": n} for job, n in count_by_job(self.jobs, positions).items()
            }
        await self.journal.commit(
            page=page, ops=[*ops, *marks], counters=totals, by_job=by_job, all_success=all_success
        )
        for orphan, new in counted:
            orphan.counted.update(new)

    def forget(self, chunk_ids: Sequence[int]) -> None:
        """The chunks are settled: their rows are read no more."""
        for chunk_id in chunk_ids:
            self._chunks.pop(chunk_id, None)
