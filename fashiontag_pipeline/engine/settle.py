"""Settling a task whose results do not account for every row sent to it.

:class:`ResultPagers` reads pages; when a task's reading ends any other way than the usual one
(every row the service accepted has a line, no chunk of unknown fate), :class:`TaskSettler`
decides what becomes of the rows without an outcome, from the chunk bodies kept in the state
store until the task is drained:

* **short** (a short page, a repeated id in place of a row, fewer images than given, orphan
  chunks): every id without a line for the task and not refused by the service is sent again
  through the writer (:meth:`TaskSettler.finish`);
* **forgotten** (404 for the task's status or a page, ``lost``): the rows written stay, the
  others go to a new task (:meth:`TaskSettler.forget`);
* **expired** (the results expired before they were all read): every id without a line becomes
  a reject of stage ``expired``, so no loss is silent (:meth:`TaskSettler.expired`).

A row is sent at most ``max_sends`` times in all: each chunk's body counts the sends before it,
and rows still without an outcome after the last become rejects of stage ``unreturned`` (a
service that takes a row and never returns it would otherwise have it sent forever, and the run
never end). Rows the service answered, on their second send or later, with a tagging result
that is no object (``"tagged"``, a list) are such rejects then: the service answered them the
same way twice (one send again cures a page garbled once), and each send more was billed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from .._models import TaggingRequest
from .batcher import STAGE_SERVER
from .jobs import Jobs
from .policy import decode_body, decode_chunk
from .returned import ReturnedRows
from .state import JobReject, Journal, changes
from .tracker import TaskBook, TaskEntry
from .validate import Item

__all__ = ["STAGE_EXPIRED", "STAGE_UNRETURNED", "TaskSettler", "done_change"]

logger = logging.getLogger("fashiontag_pipeline.engine")

STAGE_EXPIRED = "expired"
STAGE_UNRETURNED = "unreturned"
#: Sends after which rows the service answered with no tagging result object, every one of a
#: chunk, are rejects (see the module docstring), however many ``max_sends`` allows.
ANSWERED_SENDS = 2


def done_change(entry: TaskEntry) -> changes.Change:
    """The task is done: its total and result expiry (committed with its first page). The
    total kept is the service's count when it claims more than the rows written (a resume
    cuts it to them again, and reads pages past them as far as it: a write applied twice)."""
    expiry = entry.results_expire_at
    stamp = expiry.timestamp() if expiry is not None else None
    return changes.task_done(entry.task_id, max(entry.total, entry.claimed or 0), stamp)


class TaskSettler:
    """Gives every row of a task one outcome when its pages alone do not (see the module
    docstring). ``resend`` hands rows back to the writer in place of a chunk."""

    def __init__(
        self,
        *,
        journal: Journal,
        jobs: Jobs,
        book: TaskBook,
        resend: Callable[[list[Item], int, int], Awaitable[None]],
        max_sends: int,
    ) -> None:
        self.journal = journal
        self.jobs = jobs
        self.book = book
        self.resend = resend
        self.max_sends = max_sends
        #: Rows of orphan chunks counted as submitted when the task returns them.
        self.returned = ReturnedRows(journal, jobs)

    async def all_written(self, entry: TaskEntry) -> bool:
        """True when the task has no orphan chunk and its lines (those written and the page
        being committed) are as many as the rows the service accepted into it. Only when
        every chunk of the task is still accepted: once one is resolved (a settle sent its
        rows again, then a kill -9 before the task was drained), lines written for its rows
        could match the count by coincidence with rows of another chunk missing. The rows
        themselves are then checked (:meth:`finish`)."""
        if entry.orphans:
            return False
        expected = await self.journal.run(self.journal.db.accepted_rows, entry.task_id)
        assert entry.seen is not None
        return expected == len(entry.seen)

    def done_with(self, entry: TaskEntry) -> None:
        entry.seen = entry.sent = entry.refused = entry.matcher = None
        self.book.retire(entry)

    async def finish(self, entry: TaskEntry) -> None:
        """Every page is committed but the count did not settle the task (or a resume found it
        read to the end, or it holds no result at all): send again the ids without an
        outcome, then drain it."""
        if not await self.all_written(entry):
            await self.settle(entry, ("orphan", "accepted"))
        await self.journal.commit(ops=[done_change(entry), *changes.task_drained(entry.task_id)])
        self.done_with(entry)

    async def forget(self, entry: TaskEntry) -> None:
        """The service forgot the task (404) while its pages were being read, or refused a
        page of a task it ended (failed, cancelled: counted lost when it was seen so)."""
        entry.state = "lost"
        entry.advance(entry.next_offset)
        logger.warning(
            "task %s: %s after %d of %d results were read; its other rows are sent again",
            entry.task_id,
            "the service no longer knows it"
            if entry.ended is None
            else f"{entry.ended}, its pages can no longer be read",
            entry.next_offset,
            entry.total,
            extra={"task_id": entry.task_id},
        )
        await self.journal.commit(
            ops=[changes.task_state(entry.task_id, "lost")],
            counters={"lost_tasks": 1} if entry.ended is None else {},
        )
        await self.settle(entry, ("orphan", "accepted", "pending"))

    async def _rows_of(
        self, task_id: str, states: tuple[str, ...]
    ) -> list[tuple[int, int, list[tuple[int, TaggingRequest]]]]:
        """The rows of the task's chunks in ``states``: (chunk id, times its rows have been
        sent with it, [(position, request)])."""
        bodies = await self.journal.run(self.journal.db.chunk_bodies, task_id, states)
        chunks = [(cid, decode_chunk(body)) for cid, body in bodies]
        return [(cid, sends + 1, rows) for cid, (sends, rows) in chunks]

    async def expired(self, entry: TaskEntry) -> None:
        """Results expired before they were all read: every id of the task that has no
        results line becomes a reject (stage ``expired``), so no loss is silent.

        The task's ids come from the bodies of its accepted chunks (kept in the state store
        until the task is drained); ids with a results line for the task, and ids the service
        refused at write time (already rejects), are left out."""
        entry.state = "expired"
        read_upto = entry.next_offset
        entry.advance(read_upto)
        task_id = entry.task_id
        journal = self.journal
        written = entry.seen or set()
        jobs = self.jobs

        def unread() -> list[tuple[int, str]]:
            rows = [
                (pos, request.context.id)
                for _, body in journal.db.chunk_bodies(task_id, ("accepted",))
                for pos, request in decode_body(body)
            ]
            refused = journal.refused_ids(STAGE_SERVER, {ident for _, ident in rows})
            return [
                (pos, ident)
                for pos, ident in rows
                if ident not in written and ident not in refused and jobs.is_open(pos)
            ]

        rejects: list[JobReject] = [
            jobs.reject(
                pos, jobs.original(ident), "results expired before they were read", STAGE_EXPIRED
            )
            for pos, ident in await journal.run(unread)
        ]
        logger.warning(
            "results of task %s expired after %d of %d were read: %d ids written as rejects",
            task_id,
            read_upto,
            entry.total,
            len(rejects),
            extra={"task_id": task_id},
        )
        await journal.commit(
            rejects=rejects, settle=True, ops=changes.task_drained(task_id, "expired")
        )
        if entry.orphans:
            await self.settle(entry, ("orphan",))
        self.done_with(entry)

    async def settle(self, entry: TaskEntry, states: tuple[str, ...]) -> None:
        """Send again every row of the task's chunks in ``states`` that has no outcome (no
        line for the task, not refused by the service), or write it as an ``unreturned``
        reject once it has been sent ``max_sends`` times (in the transaction that resolves its
        chunk: a resume never rejects it twice). A chunk whose rows are all settled is marked
        resolved, except an accepted chunk of a task still drained normally (its body goes
        with the task)."""
        lost = entry.state == "lost"
        seen = entry.seen or set()
        journal = self.journal
        # Rows of its orphans it returned and no page commit counted (a resume that found
        # the write in flight at the kill, its task read to its end already): counted first.
        await self.returned.commit(entry)
        chunks = await self._rows_of(entry.task_id, states)
        ids = {r.context.id for _, _, rows in chunks for _, r in rows}
        refused = await journal.run(journal.refused_ids, STAGE_SERVER, ids)
        is_open = self.jobs.is_open
        for chunk_id, sends, rows in chunks:
            # Rows of a job already complete have their outcome (it completed on them).
            missing: list[Item] = [
                (r.context.id, pos, r)
                for pos, r in rows
                if r.context.id not in seen and r.context.id not in refused and is_open(pos)
            ]
            if missing and (sends >= self.max_sends or _answered_so(entry, missing, sends)):
                await self._unreturned(entry, missing, chunk_id, sends)
            elif missing:
                await self._resend_unwritten(missing, chunk_id, sends)
            elif lost or chunk_id in entry.orphans:
                await journal.commit(ops=changes.chunk_resolved(chunk_id))
            if chunk_id in entry.orphans:
                entry.orphans.discard(chunk_id)
                self.returned.forget((chunk_id,))
                self.book.orphans_pending -= 1
        if lost:
            self.done_with(entry)
        self.book.poke()

    async def _resend_unwritten(self, items: list[Item], chunk_id: int, sends: int) -> None:
        """Hand rows without an outcome back to the writer, in place of ``chunk_id`` (they
        were sent ``sends`` times)."""
        await self.resend(items, chunk_id, sends)

    async def _unreturned(
        self, entry: TaskEntry, items: list[Item], chunk_id: int, sends: int
    ) -> None:
        """Rows sent ``max_sends`` times without a result: rejects (stage ``unreturned``), and
        their chunk is resolved."""
        jobs = self.jobs
        reason = f"sent to the service {sends} times and never returned by it"
        came = entry.no_result or {}
        rejects = [
            jobs.reject(
                pos,
                jobs.original(ident),
                reason if ident not in came else _without_result(sends, came[ident]),
                STAGE_UNRETURNED,
            )
            for ident, pos, _ in items
        ]
        logger.warning(
            "task %s: %d rows sent %d times were never returned (or with no tagging result"
            " object); written as rejects (stage %s)",
            entry.task_id,
            len(rejects),
            sends,
            STAGE_UNRETURNED,
            extra={"task_id": entry.task_id},
        )
        await self.journal.commit(
            rejects=rejects, settle=True, ops=changes.chunk_resolved(chunk_id)
        )


def _answered_so(entry: TaskEntry, missing: list[Item], sends: int) -> bool:
    """Whether ``missing``, rows sent ``sends`` times, all came back from the task with a
    tagging result that is no object, on their second send or later."""
    came = entry.no_result
    return sends >= ANSWERED_SENDS and came is not None and all(i in came for i, _, _ in missing)


def _without_result(sends: int, came: str) -> str:
    """The reason of an ``unreturned`` reject whose result came, the last time it was sent,
    without a tagging result object (``came``: the start of what came, "" for nothing)."""
    what = f"taggingResult {came}" if came else "no taggingResult"
    return (
        f"sent to the service {sends} times and returned by it with no tagging result object"
        f" the last time ({what})"
    )
