"""Pagers: a bounded pool reading 100-result pages of done tasks into the sinks.

Tasks are drained oldest ``resultExpiredAt`` first. Pages of a task are fetched concurrently
(up to the adaptive page concurrency) and committed in offset order, each in one transaction
with the task's ``next_offset``, so a resume reads exactly the pages not yet written. Pages are
decoded with msgspec straight into :class:`~.pages.PageRow` (results kept as raw JSON).

Every page's rows are checked against the ids written to the task (a result under an id the
engine never sent it, as from a service that normalizes ids, is no row's outcome: it is left
out, and the row it stood for is sent again) and against the ids already written for the task
(a server that repeats an id writes it once); a row whose tagging result is not a JSON object
is left out too (:func:`~.pages.screen`), and sent again. The ids written are those of the
task's chunks, taken when its draining starts (the lists kept from their write-ahead, or read
back from the state store: exact, after a resume too).
When the last page is in, the rows written are counted against the rows the service accepted
into the task (``chunks.n_ok``); the usual task drains in the commit of its last page. Any
other end (a short count, orphan chunks, expired results, a task the service forgot) goes to
:class:`~.settle.TaskSettler`, while the other tasks' pages keep flowing.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import MAX_PAGE_SIZE
from .config import EngineConfig
from .fetch import PAGE_ATTEMPTS, UNREADABLE_PAGES, Fetched, FetchedRows, LostPage, PageFetcher
from .flow import AIMDLimiter, RetryBudget
from .page_rows import PageRows
from .pages import NotAPage, PageRow, decode_page, screen
from .policy import body_ids, decode_ids
from .settle import TaskSettler, done_change
from .state import Journal, changes
from .tracker import TaskBook, TaskEntry
from .writes import STAGE_SERVER

__all__ = ["PAGE_ATTEMPTS", "UNREADABLE_PAGES", "ResultPagers"]

logger = logging.getLogger("fashiontag_pipeline.engine")


class _NoEvent:
    def set(self) -> None:
        return None


_NO_EVENT = _NoEvent()


class ResultPagers(PageFetcher, PageRows):
    """Reads every done task's results into the sinks."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        book: TaskBook,
        config: EngineConfig,
        budget: RetryBudget,
        settler: TaskSettler,
        finished: Callable[[], bool],
    ) -> None:
        self.client = client
        self.journal = journal
        self.book = book
        self.config = config
        self.budget = budget
        self.settler = settler
        self.returned = settler.returned
        self.finished = finished
        self.slots = AIMDLimiter(config.max_page_concurrency)
        self._heap: list[tuple[float, int, TaskEntry]] = []
        self._warned_short = False
        self._order = itertools.count()
        self.pages = 0
        #: Fetched pages waiting for their turn, per task: offset -> rows (None: expired,
        #: LOST: forgotten).
        self._ready: dict[str, dict[int, Fetched]] = {}
        #: Tasks whose ready pages a page task is committing right now.
        self._committing: set[str] = set()
        #: Offsets of the pages being fetched, per task.
        self._fetching: dict[str, set[int]] = {}
        #: Per task, set when one of its pages is fetched (a committer waits for the next one).
        self._deposited: dict[str, anyio.Event] = {}
        #: Pages taken as empty since the last page that could be read.
        self._unreadable = 0
        #: Done tasks that gave not one result, None once one has (``fetch.EMPTY_TASKS``).
        self._empty_tasks: int | None = 0
        #: Results under an id the service changed were said once (then at info level).
        self._warned_changed = False
        #: The task group of the page readers (set by :meth:`run`): the ends of tasks with
        #: rows missing (:meth:`_finish`) run there too, holding no reader's slot.
        self._finishers: anyio.abc.TaskGroup

    def result_headroom(self) -> float | None:
        """Seconds until the results of the first done, unread task expire (None: none
        waits), in the service's clock."""
        waiting = [e.results_expire_at for _, _, e in self._heap if e.results_expire_at]
        if not waiting:
            return None
        now = time.time() + self.client.server_clock.correction
        return min(w.timestamp() for w in waiting) - now

    async def add(self, entry: TaskEntry) -> None:
        """Queue a done (or lost) task for draining."""
        key = entry.results_expire_at.timestamp() if entry.results_expire_at else float("inf")
        heapq.heappush(self._heap, (key, next(self._order), entry))
        self.book.poke()

    async def run(self) -> None:
        # A fixed pool of page readers, as many as the page concurrency can ever be (a slot is
        # taken before a page is handed over, so each page in flight has a reader): a task
        # started per page (anyio's ``start_soon``) cost ~35 us of CPU each, ~0.35 us/image.
        # The pages reach them through an asyncio queue, not an anyio memory stream: a waiting
        # reader's ``receive`` makes an event loop pass (its checkpoint) and an anyio event:
        # ~62,000 instructions a page more than the queue's ``get`` (a page per 100 images). The
        # engine runs on asyncio only (the state thread resolves asyncio futures); a reader
        # waiting in ``get`` is cancelled by the task group as it was in ``receive``, and ends
        # on its ``None`` once the pages before it are read, as at the stream's end.
        pages: asyncio.Queue[tuple[TaskEntry, int] | None] = asyncio.Queue()
        async with anyio.create_task_group() as tg:
            self._finishers = tg
            for _ in range(self.slots.cap):
                tg.start_soon(self._reader, pages)
            try:
                await self._schedule(pages)
            finally:
                for _ in range(self.slots.cap):
                    pages.put_nowait(None)

    async def _reader(self, pages: asyncio.Queue[tuple[TaskEntry, int] | None]) -> None:
        while (page := await pages.get()) is not None:
            await self._page(*page)

    async def _schedule(self, pages: asyncio.Queue[tuple[TaskEntry, int] | None]) -> None:
        """Hand each done task's pages to the readers, oldest expiry first, until finished."""
        while True:
            if not self._heap:
                if self.finished():
                    return
                changed = self.book.changed
                with anyio.move_on_after(1.0):
                    await changed.wait()
                continue
            _, _, entry = heapq.heappop(self._heap)
            if entry.seen is None:
                entry.seen = await self._written(entry)
            if entry.refused is None and entry.state == "done":
                entry.sent, entry.refused = await self.journal.run(self._sent_ids, entry.task_id)
            if entry.sent is not None and entry.total > len(entry.sent):
                # A count past the rows written to the task (a server's bug, a count of
                # something else): those pages could only be empty or another's, and a huge
                # count would be millions of requests. The task holds at most what was sent,
                # or more of it (a write applied twice): _past_end reads on while pages past
                # the rows written give rows of them.
                logger.warning(
                    "task %s claims %d results but was given %d rows: reading %d",
                    entry.task_id,
                    entry.total,
                    len(entry.sent),
                    len(entry.sent),
                    extra={"task_id": entry.task_id},
                )
                entry.claimed, entry.total = entry.total, len(entry.sent)
            elif entry.sent and entry.next_offset == 0:
                # A count short of the rows the service took, or none (a service that leaves
                # ``count.total`` out, or counts only some results there): read as far as
                # those rows (pages past a task's end come back empty), rather than send the
                # rest again as if they had no result.
                rows = len(entry.sent - entry.refused) if entry.refused else len(entry.sent)
                if entry.total < rows:
                    self._short_count(entry, rows)
                    entry.counted = entry.total
                    entry.total = rows
            if entry.state == "lost":
                await self.settler.settle(entry, ("orphan", "accepted", "pending"))
                continue
            if entry.state == "expired":  # gone (410) before it was done: nothing to read
                await self.settler.expired(entry)
                continue
            if entry.next_offset >= entry.total:
                # Read to its count (a resume after a kill between its last page and the
                # page past its count): that page is asked for first, as _page does.
                if entry.total > 0:
                    self._finishers.start_soon(self._finish, entry)
                else:
                    await self.settler.finish(entry)
                continue
            for offset in range(entry.next_offset, entry.total, MAX_PAGE_SIZE):
                await self.slots.acquire()
                try:
                    # The state calls above are awaited shielded and a free slot is taken
                    # without a checkpoint: a cancellation (a drain) that came meanwhile has
                    # cancelled the readers, and is taken here rather than a page handed to
                    # none.
                    await anyio.lowlevel.checkpoint_if_cancelled()
                    pages.put_nowait((entry, offset))
                except BaseException:
                    self.slots.release()
                    raise

    def _short_count(self, entry: TaskEntry, rows: int) -> None:
        """Say that a done task's count is short of its rows (a warning the first time: a
        service that counts so does it for every task)."""
        log = logger.info if self._warned_short else logger.warning
        self._warned_short = True
        log(
            "task %s is done with a result count of %d, but was given %d rows: reading that many",
            entry.task_id,
            entry.total,
            rows,
            extra={"task_id": entry.task_id},
        )

    def _sent_ids(self, task_id: str) -> tuple[set[str] | None, frozenset[str]]:
        """(the ids written to the task, the ids the service refused) (thread side).

        The ids written come from the lists this process kept when it wrote the task's chunks
        ahead (:mod:`.state.sent_ids`), else (a chunk written by an earlier process, or split)
        from the task's chunks' id lists in the state (or bodies, in older state files); None
        when a chunk of it has neither left, so no id can be called foreign. The
        refused ids each have a reject already, so a result under one must not be written too
        (a service may list a row as refused and still take it); they are read from the
        rejects, only when a chunk of the task had rows refused (rarely)."""
        db = self.journal.db
        written = db.task_chunks(task_id)
        kept = self.journal.sent_ids.take(written)  # (this process's chunks: their lists)
        sent: set[str] | None = None
        if kept is not None:
            sent = set()
            for listed in kept:
                sent.update(listed)
        elif (chunks := db.sent_chunks(task_id)) is not None:
            sent = set()
            for ids, body in chunks:
                sent.update(decode_ids(ids) if ids is not None else body_ids(body or b""))
        refused: frozenset[str] = frozenset()
        # (taken for every task: forgotten)
        since = self.journal.refusal_marks(task_id, [c for c, _ in written])
        if db.may_have_refused(task_id):
            refused = frozenset(self.journal.refused_ids(STAGE_SERVER, sent, since))
        return sent, refused

    async def _written(self, entry: TaskEntry) -> set[str]:
        """Ids already written for the task (a resume that had read some of its pages: a scan
        of the results sink, once per such task)."""
        if entry.next_offset == 0:
            return set()
        return await self.journal.run(self.journal.task_ids, entry.task_id)

    async def _page(self, entry: TaskEntry, offset: int) -> None:
        """Fetch one page; commit it in offset order.

        A fetched page waits in ``_ready`` (holding its slot, so pages in memory stay bounded
        by the page concurrency). Whichever page task finds the task's next page ready commits
        every consecutive ready page in one journal transaction (one thread hand-off, one sink
        write, one SQLite commit for several pages); the other page tasks wait until their page
        is committed."""
        task_id = entry.task_id
        fetching = self._fetching.setdefault(task_id, set())
        fetching.add(offset)
        try:
            rows = await self._fetch(entry, offset)
            if entry.state != "done":
                return  # expired or forgotten meanwhile: the page is not needed
            ready = self._ready.setdefault(task_id, {})
            ready[offset] = rows
            fetching.discard(offset)
            self._deposited.pop(task_id, _NO_EVENT).set()
            while entry.state == "done" and entry.next_offset <= offset:
                if entry.next_offset in ready and task_id not in self._committing:
                    await self._commit_ready(entry, ready)
                else:
                    await entry.advanced.wait()
        finally:
            fetching.discard(offset)
            self._deposited.pop(task_id, _NO_EVENT).set()
            if entry.state != "done":
                self._ready.pop(task_id, None)
                self._fetching.pop(task_id, None)
            self.slots.release()

    async def _commit_ready(self, entry: TaskEntry, ready: dict[int, Fetched]) -> None:
        """Commit the consecutive ready pages from ``entry.next_offset`` (one transaction)."""
        task_id = entry.task_id
        self._committing.add(task_id)
        try:
            start = entry.next_offset
            first = ready[start]
            if first is None or isinstance(first, LostPage):
                ready.pop(start)
                self._ready.pop(task_id, None)
                if first is None:
                    await self.settler.expired(entry)
                else:
                    await self.settler.forget(entry)
                return
            rows: list[PageRow] = []
            all_success = True
            end = start
            pages = 0
            while True:
                while end in ready and isinstance(page := ready[end], FetchedRows):
                    ready.pop(end)
                    kept = await self._first_of_each_id(entry, page.rows)
                    if not page.refused and len(kept) < min(MAX_PAGE_SIZE, entry.total - end):
                        entry.deficient.add(end)  # read again if rows are missing at the end
                    rows.extend(kept)
                    all_success = all_success and page.all_success
                    end = min(end + MAX_PAGE_SIZE, entry.total)
                    pages += 1
                # The next page is on its way: take it into this commit too (pages fetched
                # concurrently cost one commit, not one each).
                if end >= entry.total or end not in self._fetching.get(task_id, ()):
                    break
                event = self._deposited.get(task_id)
                if event is None:
                    event = self._deposited[task_id] = anyio.Event()
                await event.wait()
            ops = [changes.task_read_upto(task_id, end)]
            if start == 0:
                ops.insert(0, done_change(entry))
            drained = end >= entry.total
            # The usual end: every row the service accepted has a line; drain in this commit.
            quick = drained and await self.settler.all_written(entry)
            if quick:
                ops.extend(changes.task_drained(task_id))
            await self.returned.commit(
                entry,
                page=(task_id, rows),
                ops=ops,
                counters={"pages": pages},
                all_success=all_success,
            )
            self.pages += pages
            if drained:
                self._ready.pop(task_id, None)
                self._fetching.pop(task_id, None)
            if quick:
                self._empty_tasks = None
                self.settler.done_with(entry)
            elif drained:
                entry.state = "finishing"
            entry.advance(end)
            if drained and not quick:
                # (Apart: the rows missing may be read again for a while, which must not hold
                # this reader's slot and the other tasks' pages with it.)
                self._finishers.start_soon(self._finish, entry)
        finally:
            self._committing.discard(task_id)

    async def _finish(self, entry: TaskEntry) -> None:
        """The end of a task whose pages are all in and that has rows without a line (or, a
        resume, a task read to its count): pages past its count, then its pages that came
        short read again (:meth:`_read_again`, waiting up to ``read_again_window`` after the
        task was seen done for a results store that lags the status), then the settler. A
        task of its own in the pagers' task group: page reads take a slot, and a wait holds
        none, so the other tasks' pages flow meanwhile."""
        await self.slots.acquire()
        try:
            await self._past_end(entry)
        finally:
            self.slots.release()
        # (After a restart, the pages an earlier process read count as short: a kill or a
        # drain while their missing rows were awaited, a run stopped by _read_nothing.)
        await self._read_again(entry)
        self._read_nothing(entry)
        await self.settler.finish(entry)

    async def _past_end(self, entry: TaskEntry) -> None:
        """Rows written to a task still without a line once its last page is in: pages past
        ``count.total`` are asked for them, while each gives rows of them, before they are
        sent again (and billed again). A service whose offsets start at 1 answers every page
        one row early, so the last page ends a row short of the task's end, although every
        page was full; a service that applied a write twice (ids and all) holds more results
        than rows written, its count too, read only as far as those rows (see ``_schedule``).
        Results are in the order they were written, so the missing rows are the last ones. A
        page with none of them (but copies of rows read, up to the count the service claims),
        or any answer but a page (a 400 past the end, an error), leaves them to be sent
        again."""
        sent, seen = entry.sent, entry.seen
        if sent is None or seen is None or entry.total <= 0:
            return
        missing = len(sent - seen - (entry.refused or frozenset()))
        offset = entry.total
        while missing > 0:
            try:
                raw = await self.client.task_results_raw(
                    entry.task_id, offset=offset, size=min(MAX_PAGE_SIZE, missing)
                )
                given = decode_page(raw)
                found, all_success = screen(given)
            except (exc.FashiontagError, msgspec.DecodeError, NotAPage):
                return
            rows = await self._first_of_each_id(entry, found)
            offset += len(given)
            if not rows:
                if found and offset < (entry.claimed or 0):
                    continue  # copies of rows read (a write applied twice): read on
                return
            logger.info(
                "task %s: %d results found past its count of %d",
                entry.task_id,
                len(rows),
                entry.total,
                extra={"task_id": entry.task_id},
            )
            await self.returned.commit(
                entry, page=(entry.task_id, rows), counters={"pages": 1}, all_success=all_success
            )
            self.pages += 1
            missing -= len(rows)
