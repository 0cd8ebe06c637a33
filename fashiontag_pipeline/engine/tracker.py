"""Tracker: watches sealed tasks until they are done, with as few requests as possible.

One ``GET /bulk`` (list) covers every live task of the run; a task missing from it is asked for
by its status (fallback). The poll schedule is predicted from progress: every poll records each
task's processed count (``done + failure``), :class:`CompletionForecast` turns the counts into
rates and the next poll is scheduled at the predicted completion of the *earliest* finishing
task (clamped to ``[poll_min, poll_max]``), so a done task is noticed within a few tens of
milliseconds without polling fast while nothing can finish. Only while nothing progresses at
all does the interval back off (x1.6 up to ``poll_max``). A newly sealed task wakes the tracker
at once (at most one poll per ``poll_min``), so a task done on arrival is not waited for.

The list is one page of the key's newest tasks (``LIST_PAGE_SIZE``; a service that does not
page answers with every task), and a long-lived account keeps days of them (results are
readable for a week). A watched task missing from the page is asked for by its status,
concurrently; only a 404 there marks it lost (a 410, gone: its rows become ``expired``
rejects). When the last list carried more than ``LIST_FACTOR`` times the tasks being watched
and few are watched, the tracker asks for each watched task's status instead, concurrently,
and lists again every ``LIST_RECHECK`` polls; so it does after a list the service did not
give (an error, or no answer within the request deadline, which every poll waited out).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

from .. import _exceptions as exc
from .._client import LIST_PAGE_SIZE, TaggerClient
from .._models import Task, TaskStatus
from .config import EngineConfig
from .flow import REFUSED, TRANSIENT, FatalRunError, RetryBudget, redirect_fault, refused
from .forecast import CompletionForecast
from .state import Journal, changes
from .status_reads import STATUS_MAX, StatusReads, drop_contradicted, ours
from .taskbook import TaskBook, TaskEntry

__all__ = ["TaskBook", "TaskEntry", "Tracker"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: Seconds between two calls of a tracker's ``polled`` (see :attr:`Tracker.polled`).
POLLED_EVERY = 1.0


LIST_FACTOR = 8
LIST_RECHECK = 20


class Tracker:
    """Moves sealed tasks to done and hands them to the pagers."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        book: TaskBook,
        config: EngineConfig,
        budget: RetryBudget,
        on_done: Callable[[TaskEntry], Awaitable[None]],
        finished: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        polled: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        #: Called after a poll, once a :data:`POLLED_EVERY` at most (outputs removed empty
        #: made again: see Jobs.made_again; at each poll, 20 a second, it cost each job's
        #: empty outputs an fstat and a stat in the state thread, which writes the results).
        self.polled = polled
        self._polled_at = -POLLED_EVERY
        self.journal = journal
        self.book = book
        self.config = config
        self.budget = budget
        self.on_done = on_done
        self.finished = finished
        self.clock = clock
        self.forecast = CompletionForecast(config.poll_min, config.poll_max)
        self.reads = StatusReads(client, budget, clock=clock)
        self.polls = 0
        self.status_polls = 0
        self._list_size = 0
        self._since_list = 0
        #: Since when no watched task has progressed (None: none is watched), and the tasks
        #: watched at the last poll.
        self._still_since: float | None = None
        self._still_ids: frozenset[str] = frozenset()
        #: Task states seen that the spec does not name (each said once).
        self._odd_statuses: set[str] = set()
        #: The last task list asked for was not given (said once per streak).
        self._list_failing = False
        #: A task list gave a task twice, its copies differing (said once).
        self._twice = False
        #: Task id -> the task as the whole task list last showed it, for the tasks whose status
        #: is a front end's 410 page (:meth:`_gone_unless_listed`): their status is known.
        self._listed_behind: dict[str, Task] = {}
        #: Task id of :attr:`_listed_behind` -> when the list gave it (read again every half
        #: ``stall_timeout``: a task progressing between two reads is no stall).
        self._listed_at: dict[str, float] = {}
        #: The tracker's own requests that needed a retry (other stages' retries are not an
        #: outage of the polls).
        self.retried = 0

    async def run(self) -> None:
        while True:
            sealed = self.book.sealed()
            if not sealed:
                self._still_since = None
                if self.finished():
                    return
                changed = self.book.changed
                with anyio.move_on_after(self.config.poll_max):
                    await changed.wait()
                continue
            started = self.clock()
            added = self.book.added
            retried = self.retried
            progressed = await self.poll(sealed)
            if self.polled is not None and started - self._polled_at >= POLLED_EVERY:
                self._polled_at = started
                await self.polled()
            self._check_stall(progressed, sealed, retried)
            await self._sleep(started, self.forecast.next_interval(progressed), added)

    def _check_stall(self, progressed: bool, sealed: list[TaskEntry], retried: int) -> None:
        """Stop the run (FatalRunError, state saved) once no watched task has progressed for
        ``stall_timeout`` seconds: a service that holds tasks processing for ever must not
        keep a nightly job running for ever. An outage is no stall (``give_up_after`` rules
        it: a poll needed retries, :attr:`retried` moved since ``retried``), nor is a task new
        to the watch (the rows of a lost task sent again): either starts the stall clock
        again. Other stages' retries do not count: they would hide a stall for ever."""
        now = self.clock()
        ids = frozenset(e.task_id for e in sealed)
        fresh = self.retried != retried or not ids <= self._still_ids
        self._still_ids = ids
        if progressed or fresh or self._still_since is None:
            self._still_since = now
            return
        still = now - self._still_since
        if still >= self.config.stall_timeout:
            raise FatalRunError(
                f"the service has processed nothing of the {len(ids)} task(s) this run waits for"
                f" in {still:.0f} s (stall_timeout, --stall-timeout); stopped with the state"
                " saved: the same command resumes and reads them once they are done"
            )

    async def _sleep(self, started: float, interval: float, added: int) -> None:
        """Until the forecast poll; sooner (but not within poll_min of the last poll) when a
        task is added; and not at all once the run is finished."""
        until = self.clock() + interval
        while True:
            if self.finished():
                return
            if self.book.added != added:
                until = min(until, started + self.config.poll_min)
            left = until - self.clock()
            if left <= 0:
                return
            changed = self.book.changed
            with anyio.move_on_after(left):
                await changed.wait()

    async def _list(self) -> dict[str, Task] | None:
        """The task list; None when the service does not give it (a 5xx, a 409, a 200 with
        the failure body): the poll reads the tasks' statuses instead, and only when those
        are not given either is it an outage (the budget's backoff and give-up). Before, the
        poll asked for the list again in place: a service whose list broke while its statuses
        answered stopped ``run`` after ``give_up_after`` and held the daemon for ever."""
        try:
            try:
                tasks = await self.client.list_tasks(offset=0, size=LIST_PAGE_SIZE)
            except exc.ServiceError as err:
                fault = redirect_fault(err)  # (a front end's, to its maintenance page)
                if fault is None:
                    raise
                raise fault from err
        except (*TRANSIENT, exc.ResultsNotReadyError) as err:
            if not self._list_failing:
                logger.warning(
                    "the service %s (%s): the tasks' statuses are read instead",
                    "is rate limiting the task list (HTTP 429)"
                    if isinstance(err, exc.RateLimitedError)
                    else "does not give the task list",
                    " ".join(str(err).split()),
                )
            self._list_failing = True
            self._since_list = 0  # (the statuses are read until the list is tried again)
            return None
        except REFUSED as err:
            raise refused(err) from err
        self._list_failing = False
        self.budget.ok()
        self.polls += 1
        listed = {t.task_id: t for t in tasks}
        if len(listed) < len(tasks) and drop_contradicted(listed, tasks) and not self._twice:
            self._twice = True
            logger.warning(
                "the task list gives some tasks twice, saying different things: their statuses"
                " are read instead"
            )
        return listed

    def _prefer_status(self, watched: int) -> bool:
        return (
            watched <= STATUS_MAX
            and self._list_size > LIST_FACTOR * watched
            and self._since_list < LIST_RECHECK
        )

    async def _statuses(
        self, sealed: list[TaskEntry], *, probe: bool = False
    ) -> tuple[dict[str, Task], set[str]]:
        """Every watched task's status, concurrently: (those read, the ids of those unread);
        missing ones are in neither. ``probe`` (the list was not given): one task's first, and
        when that one is not given either, no other (an outage: one request, not one a task)."""
        ids = [entry.task_id for entry in sealed]
        self.polls += 1
        self.status_polls += 1
        self._since_list += 1
        if not probe:
            return await self._status_of(ids, answered=False)
        found, unread = await self._status_of(ids[:1], answered=False)
        if unread:
            self.retried += len(ids) > 1  # (the others not asked: unknown)
            return found, set(ids)
        more, unread = await self._status_of(ids[1:], answered=True)
        return {**found, **more}, unread

    async def _status_of(
        self, task_ids: list[str], *, answered: bool
    ) -> tuple[dict[str, Task], set[str]]:
        """The status of each task (:class:`StatusReads`); a poll with a task unread counts
        as retried: an unknown status is no stall. A task whose status is a front end's 410
        page and which the whole task list showed is no unknown status: held processing, it
        is under ``stall_timeout`` as any task is (counted as retried, it restarted the stall
        clock at every poll and ``run`` never ended)."""
        found, unread = await self.reads.read(task_ids, answered=answered)
        if unread - (self.reads.paging & self._listed_behind.keys()):
            self.retried += 1
        return found, unread

    async def _gone_unless_listed(
        self, listed: dict[str, Task], stale: set[str]
    ) -> dict[str, Task]:
        """``listed`` with the tasks taken as gone on a front end's 410 pages alone
        (:attr:`StatusReads.paged`) that the whole task list holds (read page by page, up to
        the one by which all were seen): a task the service lists is not gone. Before, a task
        behind a route switched for minutes (its status the front end's page, the service
        answering the rest) was taken as gone after ``FRONT_END_GONE_AFTER`` and its rows
        written ``expired`` (tagged, billed, never read). A list not given leaves them gone
        (the bound stays finite), as does a cache's copy of it (``Age``) made before a task's
        pages began: the service as it was then (a task dropped since was "listed" at every
        read, for as long as the cache kept its copy, and the engine never ended). ``stale``:
        tasks of :attr:`_listed_behind` whose list word is read again (their counts)."""
        paged, self.reads.paged = self.reads.paged, {}
        try:
            tasks = await self.client.all_tasks(
                page_size=LIST_PAGE_SIZE, looked_for={*paged, *stale}
            )
            every = {t.task_id: t for t in tasks}  # (read as far as the tasks looked for)
        except REFUSED as err:
            raise refused(err) from err
        except exc.FashiontagError:
            self._listed_at.update(dict.fromkeys(stale, self.clock()))  # (not every poll)
            return listed
        age = self.client.list_age
        made = self.reads.clock() - (age + 1.0 if age > 0 else 0.0)  # (Age: whole seconds)
        for task_id in stale & every.keys():
            self._listed_behind[task_id], self._listed_at[task_id] = every[task_id], self.clock()
        for task_id, since in paged.items():
            task = every.get(task_id) if made > since else None
            if task is not None and self.reads.gone.pop(task_id, None) is not None:
                logger.warning(
                    "task %s: its status is a front end's 410 page, but the service lists it"
                    " (%s): not gone; its status is asked again",
                    task_id,
                    task.task_status,
                    extra={"task_id": task_id},
                )
                listed = {**listed, task_id: task}
                self._listed_behind[task_id], self._listed_at[task_id] = task, self.clock()
        return listed

    def _note_status(self, task: Task) -> None:
        """Say once per word that a task's status is none the spec names (``TASK_QUEUED``):
        it is taken as processing, under ``stall_timeout`` like any task that does not
        progress."""
        status = task.task_status
        if status is TaskStatus.PROCESSING or status in self._odd_statuses:
            return
        self._odd_statuses.add(status)
        logger.warning(
            "task %s: the service says it is %r, a state the spec does not name: taken as"
            " processing",
            task.task_id,
            status,
            extra={"task_id": task.task_id},
        )

    async def poll(self, sealed: list[TaskEntry]) -> bool:
        """One round: True when some task became done or progressed."""
        unread: set[str] = set()
        if self._list_failing and len(sealed) <= STATUS_MAX and self._since_list < LIST_RECHECK:
            # The list was not given at the last try (a hang costs the request deadline
            # times the client's attempts): the statuses, until it is tried again.
            listed, unread = await self._statuses(sealed, probe=True)
        elif self._prefer_status(len(sealed)):
            listed, unread = await self._statuses(sealed)
        elif (given := await self._list()) is None:
            listed, unread = await self._statuses(sealed, probe=True)
        else:
            listed = given
            self._list_size = len(listed)
            self._since_list = 0
        # A task missing from the list is asked for by its status (a list is a page of the
        # newest tasks, and services may drop tasks from it); only a 404 there means lost.
        # (Not one its status just said is gone: asked again, it was unread at this poll and
        # the whole list's word of it, even done, never taken.)
        said_gone = self.reads.gone
        missing = [
            e.task_id
            for e in sealed
            if e.task_id not in listed and e.task_id not in unread and e.task_id not in said_gone
        ]
        if missing:
            found, unread_too = await self._status_of(missing, answered=True)
            listed, unread = {**listed, **found}, unread | unread_too
        self._listed_behind = {t: k for t, k in self._listed_behind.items() if t in unread}
        self._listed_at = {t: self._listed_at[t] for t in self._listed_behind}
        half = self.config.stall_timeout / 2  # (a progressing task is no stall: Before, its
        # list word was read again only once taken as gone, give_up_after apart, and a task
        # progressing all along was stopped as a stall when stall_timeout was shorter)
        stale = {t for t in self._listed_behind if self.clock() - self._listed_at[t] >= half}
        if self.reads.paged or stale:
            listed = await self._gone_unless_listed(listed, stale)
        self.reads.keep_only(unread)
        now = self.clock()
        done: set[str] = set()
        finished: list[tuple[TaskEntry, Task]] = []
        counts: dict[str, tuple[int, int]] = {}
        for entry in sealed:
            if entry.task_id in unread:
                if known := self._listed_behind.get(entry.task_id):  # (as the list showed it)
                    counts[entry.task_id] = (
                        known.count.done + known.count.failure,
                        known.count.total,
                    )
                continue  # its status not given this time: asked again at the next poll
            task = listed.get(entry.task_id)
            if task is not None and not ours(entry, task):
                logger.warning(
                    "task %s now describes itself as %r, not as this run's task: treated as"
                    " forgotten",
                    entry.task_id,
                    (task.description or "")[:80],
                    extra={"task_id": entry.task_id},
                )
                task = None
            elif task is None and (gone := self.reads.gone.pop(entry.task_id, None)):
                logger.warning(  # results no longer readable: as for a page answered 410
                    "task %s: the service says it is gone (HTTP 410: %s) before it was done;"
                    " its rows are written as rejects (stage expired)",
                    entry.task_id,
                    gone,
                    extra={"task_id": entry.task_id},
                )
                entry.state = "expired"
                await self.on_done(entry)
                continue
            elif task is None and entry.young(self.config.list_lag):
                # Not known yet (404) a moment after its create was answered: an eventually
                # consistent service. Before, it was taken as lost and its rows were sent
                # again, each billed twice while the task went on. Asked again next poll.
                logger.info(
                    "task %s: not known to the service yet; asked again",
                    entry.task_id,
                    extra={"task_id": entry.task_id},
                )
                continue
            elif task is None:
                logger.warning(
                    "task %s: the service no longer knows it; its rows are sent again",
                    entry.task_id,
                    extra={"task_id": entry.task_id},
                )
            elif task.ended:
                # Failed, cancelled, ...: it will never be done, but the rows it processed
                # (and billed) may be on its pages: they are read first, then the rest sent.
                logger.warning(
                    "task %s: the service says it is %s, not done; its pages are read, then"
                    " its rows without a result are sent again",
                    entry.task_id,
                    task.task_status,
                    extra={"task_id": entry.task_id},
                )
                entry.ended = str(task.task_status)
                await self.journal.commit(counters={"lost_tasks": 1})
            elif not task.done:
                self._note_status(task)
            if task is None:
                # Forgotten by the service (404): its rows without an outcome are sent again.
                entry.state = "lost"
                await self.journal.commit(
                    ops=[changes.task_state(entry.task_id, "lost")],
                    counters={"lost_tasks": 1},
                )
                await self.on_done(entry)
                continue
            count = task.count
            if not task.done and entry.ended is None:
                counts[entry.task_id] = (count.done + count.failure, count.total)
                continue
            counts[entry.task_id] = (count.total, count.total)
            done.add(entry.task_id)
            finished.append((entry, task))
        if finished:
            # The pagers record "done" with the task's first page (one commit less per task:
            # a resume that finds the task still open simply asks for its status again).
            for entry, task in finished:
                entry.state = "done"
                # (An ended task's pages are not waited for as a lagging results store's.)
                entry.done_at = time.monotonic() if entry.ended is None else None
                entry.total = task.count.total
                entry.results_expire_at = task.results_expire_at
                await self.on_done(entry)
        progressed = self.forecast.observe(now, counts, frozenset(done))
        return bool(done) or progressed
