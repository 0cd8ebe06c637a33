"""Pagers: a bounded pool reading 100-result pages of done tasks into the sinks.

Tasks are drained oldest ``resultExpiredAt`` first. Pages of a task are fetched concurrently
(up to the adaptive page concurrency) and committed in offset order, each in one transaction
with the task's ``next_offset``, so a resume reads exactly the pages not yet written. Pages are
decoded with msgspec straight into :class:`~.sinks.PageRow` (results kept as raw JSON).

When a task is drained, its orphan chunks (writes of unknown fate to a task that expired) are
settled: ids missing from the task's results are sent again through the writer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import MAX_PAGE_SIZE
from .batcher import BODY_SQL, STAGE_SERVER, decode_body, drop_bodies_ops
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget
from .sinks import PageRow, Reject, page_decoder
from .state import Journal, split_position
from .tracker import TaskBook, TaskEntry
from .validate import Item

__all__ = ["ResultPagers"]

logger = logging.getLogger("fashiontag_pipeline.engine")

STAGE_EXPIRED = "expired"


class _NoEvent:
    def set(self) -> None:
        return None


_NO_EVENT = _NoEvent()


class ResultPagers:
    """Reads every done task's results into the sinks."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        book: TaskBook,
        config: EngineConfig,
        budget: RetryBudget,
        sources: list[str],
        resend: Callable[[list[Item], int], Awaitable[None]],
        finished: Callable[[], bool],
    ) -> None:
        self.client = client
        self.journal = journal
        self.book = book
        self.config = config
        self.budget = budget
        self.sources = sources
        self.resend = resend
        self.finished = finished
        self.slots = AIMDLimiter(config.max_page_concurrency)
        self._heap: list[tuple[float, int, TaskEntry]] = []
        self._order = itertools.count()
        self.pages = 0
        self.lost_unidentified = 0
        #: Fetched pages waiting for their turn, per task: offset -> rows (None: expired).
        self._ready: dict[str, dict[int, list[PageRow] | None]] = {}
        #: Tasks whose ready pages a page task is committing right now.
        self._committing: set[str] = set()
        #: Offsets of the pages being fetched, per task.
        self._fetching: dict[str, set[int]] = {}
        #: Per task, set when one of its pages is fetched (a committer waits for the next one).
        self._deposited: dict[str, anyio.Event] = {}

    async def add(self, entry: TaskEntry) -> None:
        """Queue a done (or lost) task for draining."""
        key = entry.results_expire_at.timestamp() if entry.results_expire_at else float("inf")
        heapq.heappush(self._heap, (key, next(self._order), entry))
        self.book.poke()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                if not self._heap:
                    if self.finished():
                        return
                    changed = self.book.changed
                    with anyio.move_on_after(1.0):
                        await changed.wait()
                    continue
                _, _, entry = heapq.heappop(self._heap)
                if entry.state == "lost":
                    await self._settle(entry, lost=True)
                    continue
                if entry.orphans and entry.seen is None:
                    entry.seen = await self._scan(entry)
                if entry.next_offset >= entry.total:
                    await self._drained(entry)
                    continue
                for offset in range(entry.next_offset, entry.total, MAX_PAGE_SIZE):
                    await self.slots.acquire()
                    tg.start_soon(self._page, entry, offset)

    async def _fetch(self, entry: TaskEntry, offset: int) -> list[PageRow] | None:
        """One page, or None when the task's results have expired."""
        size = min(MAX_PAGE_SIZE, entry.total - offset)
        while True:
            try:
                raw = await self.client.task_results_raw(entry.task_id, offset=offset, size=size)
            except exc.ResultsExpiredError:
                return None
            except exc.ResultsNotReadyError as err:
                await self.budget.failed(err, f"results of task {entry.task_id}")
                continue
            except exc.RateLimitedError as err:
                self.slots.throttled()
                await self.budget.failed(err, f"results of task {entry.task_id}")
                continue
            except (exc.TransportError, exc.ServerError) as err:
                await self.budget.failed(err, f"results of task {entry.task_id}")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
                raise FatalRunError(f"the service refused the run: {err}") from err
            self.budget.ok()
            self.slots.success()
            try:
                page = page_decoder.decode(raw)
            except msgspec.DecodeError as err:
                await self.budget.failed(err, f"results of task {entry.task_id}")
                continue
            return page.data.results if page.data is not None else []

    async def _scan(self, entry: TaskEntry) -> set[str]:
        """Ids of the pages a previous attempt already wrote (needed to settle orphans)."""
        seen: set[str] = set()
        for offset in range(0, entry.next_offset, MAX_PAGE_SIZE):
            rows = await self._fetch(entry, offset)
            if rows is None:
                break
            seen.update(r.id for r in rows)
        return seen

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

    async def _commit_ready(self, entry: TaskEntry, ready: dict[int, list[PageRow] | None]) -> None:
        """Commit the consecutive ready pages from ``entry.next_offset`` (one transaction)."""
        task_id = entry.task_id
        self._committing.add(task_id)
        try:
            start = entry.next_offset
            if ready[start] is None:
                ready.pop(start)
                self._ready.pop(task_id, None)
                await self._expired(entry)
                return
            rows: list[PageRow] = []
            end = start
            pages = 0
            while True:
                while end in ready and ready[end] is not None:
                    page = ready.pop(end)
                    assert page is not None
                    rows.extend(page)
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
            if entry.seen is not None:
                entry.seen.update(r.id for r in rows)
            ops: list[tuple[str, tuple[object, ...]]] = [
                ("UPDATE tasks SET next_offset=? WHERE task_id=?", (end, task_id))
            ]
            drained = end >= entry.total
            if drained:
                ops.extend(self._drained_ops(task_id))
            await self.journal.commit(page=(task_id, rows), ops=ops, counters={"pages": pages})
            self.pages += pages
            if drained:
                entry.state = "drained"
                self._ready.pop(task_id, None)
                self._fetching.pop(task_id, None)
            entry.advance(end)
            if drained:
                await self._settle(entry, lost=False)
        finally:
            self._committing.discard(task_id)

    async def _rows_of(self, task_id: str, states: tuple[str, ...]) -> list[tuple[int, list]]:  # type: ignore[type-arg]
        def load() -> list[tuple[int, bytes]]:
            marks = ",".join("?" * len(states))
            cur = self.journal.db.db.execute(
                f"SELECT chunk_id, {BODY_SQL} FROM chunks"
                f" WHERE task_id=? AND state IN ({marks}) AND {BODY_SQL} IS NOT NULL",
                (task_id, *states),
            )
            return list(cur)

        return [(cid, decode_body(body)) for cid, body in await self.journal.run(load)]

    async def _expired(self, entry: TaskEntry) -> None:
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

        def unread() -> list[tuple[int, str]]:
            cur = journal.db.db.execute(
                f"SELECT {BODY_SQL} FROM chunks WHERE task_id=? AND state='accepted'"
                f" AND {BODY_SQL} IS NOT NULL ORDER BY chunk_id",
                (task_id,),
            )
            bodies = [body for (body,) in cur]
            written = journal.results.task_ids(task_id) if read_upto else set()
            refused = journal.rejects.ids_of_stage(STAGE_SERVER)
            out: list[tuple[int, str]] = []
            for body in bodies:
                for pos, request in decode_body(body):
                    ident = request.context.id
                    if ident not in written and ident not in refused:
                        out.append((pos, ident))
            return out

        rejects: list[Reject] = []
        for pos, ident in await journal.run(unread):
            src, line = split_position(pos)
            rejects.append(
                Reject(
                    ident,
                    "results expired before they were read",
                    STAGE_EXPIRED,
                    line,
                    self.sources[src],
                )
            )
        missing = entry.total - read_upto - len(rejects)
        if missing > 0:
            self.lost_unidentified += missing
        logger.warning(
            "results of task %s expired after %d of %d were read: %d ids written as rejects",
            task_id,
            read_upto,
            entry.total,
            len(rejects),
        )
        await journal.commit(
            rejects=rejects,
            ops=[
                ("UPDATE tasks SET state='expired' WHERE task_id=?", (task_id,)),
                *drop_bodies_ops(task_id),
            ],
        )
        await self._settle(entry, lost=False)

    @staticmethod
    def _drained_ops(task_id: str) -> list[tuple[str, tuple[object, ...]]]:
        return [
            ("UPDATE tasks SET state='drained' WHERE task_id=?", (task_id,)),
            *drop_bodies_ops(task_id),
        ]

    async def _drained(self, entry: TaskEntry) -> None:
        entry.state = "drained"
        await self.journal.commit(ops=self._drained_ops(entry.task_id))
        await self._settle(entry, lost=False)

    async def _settle(self, entry: TaskEntry, *, lost: bool) -> None:
        """Send again the rows of orphan chunks (all chunks of a lost task) that the task's
        results do not hold."""
        if entry.orphans or lost:
            states = ("orphan", "accepted", "pending") if lost else ("orphan",)
            seen = entry.seen or set()
            for chunk_id, rows in await self._rows_of(entry.task_id, states):
                missing: list[Item] = [
                    (r.context.id, pos, r) for pos, r in rows if r.context.id not in seen
                ]
                if missing:
                    await self.resend(missing, chunk_id)
                else:
                    await self.journal.commit(
                        ops=[("UPDATE chunks SET state='resolved' WHERE chunk_id=?", (chunk_id,))]
                    )
                if chunk_id in entry.orphans:
                    entry.orphans.discard(chunk_id)
                    self.book.orphans_pending -= 1
            entry.seen = None
        if lost:
            entry.state = "drained"
        self.book.poke()
