"""Fetching one results page of a done task (a part of :class:`~.pagers.ResultPagers`).

A page is asked for with its offset and size; transient faults (429, 5xx, timeouts, 409) wait
under the run's retry budget; a refusal or a body that is not the spec's JSON is asked again
``PAGE_ATTEMPTS`` times in all, then taken as a page with no result (its rows are sent again),
and ``UNREADABLE_PAGES`` such pages in a row stop a run that may give up. A page holding fewer
results than asked, short of the task's end, is followed by a request for the rest of its range.
A page longer than ``max_answer_bytes`` (a service that answers many tags an image) is asked
again with half as many results, down to one, and later pages are asked that size (doubled
back once a page of it is a quarter of the limit or less).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._connect import unreadable_answer
from .._models import MAX_PAGE_SIZE
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget, redirect_fault
from .pages import NotAPage, PageRow, decode_page, screen
from .tracker import TaskEntry

__all__ = [
    "EMPTY_TASKS",
    "LOST",
    "PAGE_ATTEMPTS",
    "UNREADABLE_PAGES",
    "Fetched",
    "FetchedRows",
    "LostPage",
    "PageFetcher",
]

logger = logging.getLogger("fashiontag_pipeline.engine")


class LostPage:
    """A page the service answered 404 for: the task is forgotten."""


LOST = LostPage()


class FetchedRows(NamedTuple):
    """A fetched page: its rows with a tagging result, whether all are successes, and how
    many results the service gave (those without a tagging result included)."""

    rows: list[PageRow]
    all_success: bool
    given: int = 0
    #: Taken as empty without a page (refused past its attempts, or past the service's own
    #: count): not one to read again.
    refused: bool = False


Fetched = FetchedRows | None | LostPage
#: Answers of a page that asking again rarely cures, after which it is taken as empty.
PAGE_ATTEMPTS = 4
#: The pause before the first of those attempts again (doubled for each next one).
PAGE_RETRY_DELAY = 0.1
#: Seconds from a task's first page refused past ``PAGE_ATTEMPTS`` during which its refused
#: pages are asked for again: a service whose status says done a moment before its results can
#: be read refuses them meanwhile (a 400 "not ready": the spec shows no status code for it),
#: its first page or its later ones (a store readable part by part, a task back to processing
#: for a moment). Taken as empty at once, their rows were sent (and billed) again, and ten such
#: pages stopped the run.
NOT_READY_GRACE = 10.0
#: The longest pause between two of those attempts.
NOT_READY_PAUSE = 1.0
#: Bytes of results pages read at once (each held, with its copy while it is read, until its
#: commit). A page is ~0.5 MB, so the page concurrency bounds them; a service whose pages
#: come near ``max_answer_bytes`` (16 MiB) had them read 16 at a time (245 MB peak RSS for
#: 15 MiB pages). Past it, the concurrency is cut to the pages of that length it holds.
PAGE_BYTES = 64 << 20
#: Pages in a row taken as empty, with no readable page between them, after which a run that
#: may give up (``fashiontag run``; not the daemon) stops instead of sending their rows again.
UNREADABLE_PAGES = 10
#: Done tasks whose pages, all read (and read again), gave not one result of a row written to
#: them (pages of the spec's shape, empty: results under another key, a service whose results
#: API changed), while no task has given one yet, after which a run that may give up stops
#: instead of sending their rows again: every row was sent ``max_sends`` times, then rejected,
#: exit 0. One such task alone (a service that lost its rows) has its rows sent again, and so
#: has a task of rows a service that returns others never returns.
EMPTY_TASKS = 2


class PageFetcher:
    """Fetching pages, mixed into :class:`~.pagers.ResultPagers` (its client, page slots,
    retry budget and config)."""

    client: TaggerClient
    config: EngineConfig
    budget: RetryBudget
    slots: AIMDLimiter
    _unreadable: int
    _empty_tasks: int | None
    #: Results a page is asked for at most: fewer than the spec's 100 once a page of them was
    #: longer than ``max_answer_bytes`` (an instance attribute from then on).
    _page_rows: int = MAX_PAGE_SIZE
    #: Pages of tasks another page of which was read, refused past ``PAGE_ATTEMPTS``: read
    #: later (refused for a moment) and taken as empty (refused for good; see
    #: :meth:`_not_ready_yet`). Instance attributes from their first count on.
    _refused_a_moment: int = 0
    _refused_for_good: int = 0

    async def _fetch(self, entry: TaskEntry, offset: int) -> Fetched:
        """The page at ``offset`` (see :meth:`_fetch_range`), read to the end of its range.

        A page holding fewer results than asked, short of the task's end, is followed by a
        request for the rest of its range: a server whose pages hold fewer rows than the
        spec's 100 would otherwise leave the same rows unread in every task they are sent to
        (sent again ``max_sends`` times, then rejects). A page short because the service
        left a row out costs one request more, whose rows the next page repeats (written
        once)."""
        size = min(MAX_PAGE_SIZE, entry.total - offset)
        got = await self._fetch_range(entry, offset, size)
        while isinstance(got, FetchedRows) and 0 < got.given < size:
            more = await self._fetch_range(entry, offset + got.given, size - got.given)
            if not isinstance(more, FetchedRows) or more.given == 0:
                break
            got = FetchedRows(
                got.rows + more.rows, got.all_success and more.all_success, got.given + more.given
            )
        return got

    async def _fetch_range(self, entry: TaskEntry, offset: int, size: int) -> Fetched:
        """``size`` results from ``offset``; None when the task's results have expired, LOST
        when it is forgotten.

        An answer that asking again rarely cures (a 4xx other than those with a meaning of
        their own; a body that is not the spec's JSON) is asked for again ``PAGE_ATTEMPTS``
        times in all, then taken as a page with no result: the task's rows without a line are
        sent again when its last page is in (``max_sends`` bounds them). It never stops the run
        (a long-lived engine serves other manifests) nor holds the page for ever (its slot would
        hold every other task's pages back). Only when ``UNREADABLE_PAGES`` pages in a row are
        taken as empty (the service refuses every page: an API change, a proxy in the way) does
        a run that may give up stop, state saved, rather than send every row again."""
        what = f"results of task {entry.task_id}"
        unusable = 0
        waited = False
        while True:
            size = min(size, self._page_rows)
            problem: Exception
            try:
                raw = await self.client.task_results_raw(entry.task_id, offset=offset, size=size)
            except exc.ResultsExpiredError as err:
                if not err.foreign or entry.results_expire_at is None or self._expired(entry):
                    return None
                # A front end's 410 page (a route switched, an API version retired) before
                # the results' stated expiry: no word of the service's. Taken as the expiry,
                # the task's unread rows were `expired` rejects and the run exit 0.
                await self.budget.failed(
                    exc.ServerError(f"{err} (not the service's answer)", **err.answer()), what
                )
                continue
            except exc.TaskNotFoundError:
                # Past resultExpiredAt, a service that forgets such tasks (the reference one,
                # a result TTL later) says 404: the results are gone, as after a 410. Taken as
                # a task forgotten untagged, every unread row was sent (and billed) again.
                return None if self._expired(entry) else LOST
            except exc.RateLimitedError as err:
                self.slots.throttled()
                await self.budget.failed(err, what)
                continue
            except (
                exc.AuthenticationError,
                exc.PermissionDeniedError,
                exc.UnsupportedLanguageError,
            ) as err:
                if isinstance(err, exc.PermissionDeniedError) and self._expired(entry):
                    return None  # (past resultExpiredAt: a 403 is the expiry's, not the key's)
                raise FatalRunError(f"the service refused the run: {err}") from err
            except (exc.ResultsNotReadyError, exc.TransportError, exc.ServerError) as err:
                if entry.ended is not None and isinstance(err, exc.ResultsNotReadyError):
                    return self._ended_unread(entry, offset, err)
                if size > 1 and unreadable_answer(err) == "answering more than max_answer_bytes":
                    self._fewer_rows(entry, size, err)  # (asked again at once, half as many)
                    continue
                await self.budget.failed(err, what)
                continue
            except exc.ServiceError as err:  # any other refusal (400 past a task's end, ...)
                if err.status in (301, 308):
                    # Moved for good (http -> https, a new host or path): asking again never
                    # reads the page (it held a run to --give-up-after, a daemon for ever).
                    # Stopped at once, as a status read or a write so answered: the line
                    # names the base URL to give.
                    raise FatalRunError(f"the service has moved: {err}") from err
                fault = redirect_fault(err)
                if fault is not None:
                    # It says nothing of the page. Taken as empty after four tries in 0.7 s,
                    # its rows were billed again: transient, like a 5xx.
                    await self.budget.failed(fault, what)
                    continue
                if entry.ended is not None:
                    return self._ended_unread(entry, offset, err)
                if entry.counted is not None and offset >= entry.counted:
                    # Past the service's own count, read only because more rows were written
                    # to the task: a refusal there is the end of its results (a service that
                    # lost rows), no page to ask again nor one that stops the run.
                    logger.info(
                        "%s at offset %d, past its count of %d: %s; taken as its end",
                        what,
                        offset,
                        entry.counted,
                        " ".join(str(err).split()),
                    )
                    return FetchedRows([], True, refused=True)
                problem = err
            else:
                self.slots.success()
                # (a page read in parts is held whole, its parts together, until its commit)
                held = len(raw) * -(-MAX_PAGE_SIZE // size) if size < MAX_PAGE_SIZE else len(raw)
                if held * self.slots.limit > PAGE_BYTES:
                    self.slots.window = float(max(1, PAGE_BYTES // held))
                if (
                    size == self._page_rows < MAX_PAGE_SIZE
                    and 4 * len(raw) <= self.client.limits.max_answer_bytes
                ):
                    self._page_rows = min(MAX_PAGE_SIZE, 2 * size)
                try:
                    decoded = decode_page(raw)
                except NotAPage as err:  # (a refusal with 200, whose words may quote the key)
                    problem = NotAPage(self.client.masked(str(err)))
                except msgspec.DecodeError as err:
                    problem = err
                else:
                    break
            unusable += 1
            reason = " ".join(str(problem).split())
            if unusable >= PAGE_ATTEMPTS and self._not_ready_yet(entry):
                logger.info(
                    "%s at offset %d: %s; the task's pages may not be readable yet: asking again",
                    what,
                    offset,
                    reason,
                    extra={"task_id": entry.task_id},
                )
                waited = True
                await anyio.sleep(NOT_READY_PAUSE)
                continue
            if unusable >= PAGE_ATTEMPTS:
                if entry.readable:
                    self._refused_for_good += 1
                logger.warning(
                    "task %s: its results page at offset %d was refused or malformed %d times"
                    " (%s); taken as a page with no result (rows without one are sent again)",
                    entry.task_id,
                    offset,
                    unusable,
                    reason,
                    extra={"task_id": entry.task_id},
                )
                self._unreadable += 1
                if self._unreadable >= UNREADABLE_PAGES and math.isfinite(
                    self.config.give_up_after
                ):
                    raise FatalRunError(
                        f"the service refused or garbled {self._unreadable} results pages in a"
                        f" row, none readable between them (last: {what} at offset {offset}:"
                        f" {reason}); stopped with the state saved rather than send their rows"
                        " again: the same command resumes"
                    )
                return FetchedRows([], True, refused=True)
            # Not an outage: a short pause of its own, not the budget's growing backoff.
            logger.info("%s at offset %d: %s; asking again", what, offset, reason)
            await anyio.sleep(min(NOT_READY_PAUSE, PAGE_RETRY_DELAY * 2 ** (unusable - 1)))
        self.budget.ok()
        self._unreadable = 0
        if waited and entry.readable:
            self._refused_a_moment += 1
        entry.readable = True
        rows, all_success = screen(decoded)
        if len(rows) < len(decoded):
            _no_result(entry, decoded, rows, self.client.masked)
            logger.warning(
                "task %s: %d results at offset %d came without a tagging result object;"
                " left out (their rows are sent again)",
                entry.task_id,
                len(decoded) - len(rows),
                offset,
                extra={"task_id": entry.task_id},
            )
        return FetchedRows(rows, all_success, len(decoded))

    def _fewer_rows(self, entry: TaskEntry, size: int, err: Exception) -> None:
        """A page of ``size`` results was longer than ``max_answer_bytes``: pages are asked
        with half as many from now on (every reader that asked ``size`` halves it once). It
        stopped the run after ``--give-up-after`` instead, every run again: a catalogue whose
        results are that long never completed, and a daemon asked for the same pages for ever."""
        fewer = max(1, size // 2)
        if fewer >= self._page_rows:
            return
        first = self._page_rows == MAX_PAGE_SIZE
        self._page_rows = fewer
        # A page's range (read in parts) holds that much at least: as few read at once as
        # PAGE_BYTES holds, before one of them is read.
        most = float(max(1, PAGE_BYTES // self.client.limits.max_answer_bytes))
        self.slots.window = min(self.slots.window, most)
        (logger.warning if first else logger.info)(
            "task %s: a results page of %d was longer than max_answer_bytes (%s): asking %d"
            " results a page",
            entry.task_id,
            size,
            " ".join(str(err).split()),
            fewer,
            extra={"task_id": entry.task_id},
        )

    def _read_nothing(self, entry: TaskEntry) -> None:
        """A done task whose pages are all in (and read again) has rows without a line: when
        not one of its rows came back, and no task has given a row yet (``EMPTY_TASKS`` such
        tasks), a run that may give up stops, state saved, before their rows are sent again.
        A resume reads their pages again (``ResultPagers._schedule``)."""
        sent, seen = entry.sent, entry.seen
        if seen:
            self._empty_tasks = None  # the service returns results: rows it left out are its
            return
        if self._empty_tasks is None or entry.ended is not None:
            return
        if not sent or not sent - (entry.refused or frozenset()):
            return  # no row the service took
        self._empty_tasks += 1
        logger.warning(
            "task %s is done but its pages gave not one result of the %d rows written to it",
            entry.task_id,
            len(sent),
            extra={"task_id": entry.task_id},
        )
        if self._empty_tasks >= EMPTY_TASKS and math.isfinite(self.config.give_up_after):
            came = entry.no_result
            why = (
                "results under another key, a results API that changed?"
                if not came
                # (Results under the spec's key, none a tagging result: "another key" sent
                # whoever read it looking for a renamed field.)
                else f"its {len(came):,} results came with no tagging result object (no JSON"
                f" object: {next(iter(came.values())) or 'none'})."
            )
            raise FatalRunError(
                f"the service has given no result yet: {self._empty_tasks} done tasks, their"
                f" pages read to their end, gave none (last: task {entry.task_id}, {len(sent)} rows"
                f" written to it): {why} Stopped with the state saved rather than send their"
                " rows again: the same command resumes, reading those pages again"
            )

    @staticmethod
    def _ended_unread(entry: TaskEntry, offset: int, err: Exception) -> LostPage:
        """A page of a task the service ended (failed, cancelled) refused: it may hold no
        results at all, so the reading ends there (no attempts again, no grace, not a page
        that stops the run) and its rows without a result are sent again."""
        logger.info(
            "task %s (%s): its results page at offset %d was refused (%s); its rows without a"
            " result are sent again",
            entry.task_id,
            entry.ended,
            offset,
            " ".join(str(err).split()),
            extra={"task_id": entry.task_id},
        )
        return LOST

    def _expired(self, entry: TaskEntry) -> bool:
        """Whether the task's ``resultExpiredAt`` has gone by, in the service's clock: a
        refusal of its pages then says the results are gone (the spec shows no status for a
        read after it: a 403 as well as a 410, or a 404 once the task is forgotten), not that
        the key is refused or the task forgotten before its rows were tagged."""
        expiry = entry.results_expire_at
        now = time.time() + self.client.server_clock.correction
        return expiry is not None and expiry.timestamp() <= now

    def _not_ready_yet(self, entry: TaskEntry) -> bool:
        """Whether a refused page of ``entry`` is asked for again past ``PAGE_ATTEMPTS``: the
        task's first such refusal is under ``NOT_READY_GRACE`` seconds old, whether or not
        another page of it was read (only while none was, before: a service that answered its
        first page and refused the others with 400 for 2 s, the task back to processing, had
        up to 1,400 rows of 2,000 billed twice); but once another page was read, only while
        the pages so refused were read later at least as often as they were refused for good.
        Waited for each time, a page the service always refuses (rows it lost, a page it
        calls invalid) of every task stalled reading for the whole grace a task, its later
        pages holding the page slots meanwhile (44 s against 4 s for ten such tasks)."""
        if entry.ended is not None:
            return False
        if entry.readable and self._refused_for_good > self._refused_a_moment:
            return False
        now = time.monotonic()
        if entry.refused_at is None:
            entry.refused_at = now
        return now - entry.refused_at < NOT_READY_GRACE


#: How much of a result without a tagging result object a reject quotes.
_QUOTED = 60


def _no_result(
    entry: TaskEntry, decoded: list[PageRow], kept: list[PageRow], masked: Callable[[str], str]
) -> None:
    """Note in ``entry`` the rows :func:`screen` left out of ``decoded`` (kept: ``kept``),
    each with the start of what came for it (see :attr:`TaskEntry.no_result`), the keys sent
    ``masked`` in it (the service's words: a gateway's refusal may quote the key) before it
    is cut."""
    taken = {row.id for row in kept}
    noted = entry.no_result if entry.no_result is not None else {}
    for row in decoded:
        if row.id not in taken:
            text = masked(bytes(row.tagging_result).decode("utf-8", "replace"))
            noted[row.id] = text[:_QUOTED] + ("..." if len(text) > _QUOTED else "")
    entry.no_result = noted
