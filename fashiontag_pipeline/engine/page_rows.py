"""Which rows of a results page are new outcomes of their task (a part of
:class:`~.pagers.ResultPagers`).

A page's rows are checked against the ids written to the task and the ids already written
for it (:meth:`PageRows._first_of_each_id`): a server may repeat an id, in a page or across
pages, answer under an id it was never given, or under an id it changed on the way back (case,
spacing, Unicode form, leading zeros, a number, cut short: :mod:`.idmatch`). Pages that came
short of new rows are read again before the rows still missing are sent again
(:meth:`PageRows._read_again`): offset paging over an order that changes between reads, a page
answered with the one before it, a results store that lags the status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import MAX_PAGE_SIZE
from .config import EngineConfig
from .flow import TRANSIENT, AIMDLimiter, RetryBudget
from .idmatch import CUT_PAIR, IdMatcher
from .pages import NotAPage, PageRow, decode_page, screen
from .returned import ReturnedRows
from .state import Journal
from .tracker import TaskEntry

__all__ = ["READ_AGAIN_PAUSE", "REREAD_PASSES", "PageRows"]

#: Passes over the pages of a task that came short of new rows, each finding rows, made one
#: after another (:meth:`ResultPagers._read_again`); passes after them wait a pause first.
REREAD_PASSES = 3
#: The first pause before a pass that found nothing is tried again (doubled each time), within
#: ``EngineConfig.read_again_window`` after the task was seen done: a results store that lags
#: the status.
READ_AGAIN_PAUSE = 0.25

logger = logging.getLogger("fashiontag_pipeline.engine")


class PageRows:
    """The page-rows half of :class:`~.pagers.ResultPagers` (mixed into it)."""

    client: TaggerClient
    config: EngineConfig
    journal: Journal
    returned: ReturnedRows
    slots: AIMDLimiter
    budget: RetryBudget
    pages: int
    _warned_changed: bool

    async def _read_again(self, entry: TaskEntry) -> None:
        """Rows written to a task still without a line once its pages are all in, after
        :meth:`_past_end`: the pages that came short of new rows (a repeated id, a row left
        out, an id never sent) are asked for again before those rows are sent again (and
        billed again). A service whose offset paging runs over an order that changes between
        reads (a row on two pages and another on none), that answers a page with the one
        before it, or whose results store lags its status (pages short for a moment after
        "done"), returns them on another read. Passes go on while they find rows (the first
        ``REREAD_PASSES`` of them at once) and otherwise with growing pauses until
        ``read_again_window`` seconds after the task was seen done (30 by default: a resend
        bills again, a wait costs only time); a row the service never returns costs those
        page reads, not a send, and is sent again after the window. A pass takes a page slot,
        a pause holds none. An outage (a 5xx, a 429, no answer) has the pass made again under the
        run's retry budget; any other answer but a page ends the reading.

        The rows missing need not be on a page that came short: a stale page served in place
        of the one before it gives that page's rows, new ones, so the page that comes short is
        another. A pass over the pages that came short that leaves rows missing is followed by
        passes over every page of the task."""
        every_page = range(0, entry.total, MAX_PAGE_SIZE)
        # (Every page came short, or a restart counts every page read before as short: one
        # pass over them is the pass over every page, not followed by the same pages again.)
        offsets: Sequence[int] = (
            every_page if entry.deficient.issuperset(every_page) else sorted(entry.deficient)
        )
        entry.deficient = set()
        sent, seen = entry.sent, entry.seen
        if not offsets or sent is None or seen is None:
            return
        missing = len(sent - seen - (entry.refused or frozenset()))
        passes = 0
        pause = READ_AGAIN_PAUSE
        outage = False
        while missing > 0:
            found = 0
            failed: Exception | None = None
            await self.slots.acquire()  # (a pass reads pages in a slot; a pause holds none)
            try:
                for offset in offsets:
                    end = min(offset + MAX_PAGE_SIZE, entry.total)
                    # A page shorter than asked is read on to its range's end: a service whose
                    # pages hold fewer rows than asked answers each range in parts.
                    while offset < end and missing - found > 0 and failed is None:
                        try:
                            raw = await self.client.task_results_raw(
                                entry.task_id, offset=offset, size=end - offset
                            )
                            given = decode_page(raw)
                            page, all_success = screen(given)
                        except TRANSIENT as err:
                            failed = err  # (an outage: the pass is made again, below)
                            break
                        except (exc.FashiontagError, msgspec.DecodeError, NotAPage):
                            return
                        offset = offset + len(given) if given else end
                        rows = await self._first_of_each_id(entry, page, again=True)
                        if not rows:
                            continue
                        found += len(rows)
                        await self.returned.commit(
                            entry,
                            page=(entry.task_id, rows),
                            counters={"pages": 1},
                            all_success=all_success,
                        )
                        self.pages += 1
            finally:
                self.slots.release()
            missing -= found
            if failed is not None:
                # A 5xx, a 429, no answer, past the client's own retries: the pass is made
                # again under the run's retry budget (``--give-up-after`` stops the run, state
                # saved), as a page's first read is, not taken for rows the task lacks (they
                # were sent and billed again, the store merely down for a few seconds).
                await self.budget.failed(failed, f"results of task {entry.task_id}")
                outage = True
                continue
            if outage:
                outage = False
                self.budget.ok()
            if found:
                logger.info(
                    "task %s: its pages read again gave %d rows more (%d still missing)",
                    entry.task_id,
                    found,
                    max(missing, 0),
                    extra={"task_id": entry.task_id},
                )
                passes += 1
            if missing > 0 and offsets is not every_page:
                offsets = every_page  # (no pause: these pages were not read again yet)
                continue
            if found and passes < REREAD_PASSES:
                continue
            # (None found, or rows still coming after that many passes: a store that catches
            # up row by row; read again after a pause while the window lasts.)
            if entry.ended_unknown:
                await self._ask_ended(entry)
            left = (
                entry.done_at + self.config.read_again_window - time.monotonic()
                if entry.done_at is not None
                else 0.0
            )
            if left <= 0:
                return
            await anyio.sleep(min(pause, left))
            pause *= 2

    async def _ask_ended(self, entry: TaskEntry) -> None:
        """A task seen done before this process (a resume) with rows still missing once its
        pages are read again: whether the service ended it (failed, cancelled) is not in the
        state, so its status is asked for once before the read-again window is waited for. An
        ended task's missing rows were never processed (no results store lags them): they are
        sent again at once, as the process that saw it end would have. Before, a resume waited
        the whole window (30 s) for them. Any failure to tell keeps the window."""
        entry.ended_unknown = False
        try:
            task = await self.client.task_status(entry.task_id)
        except (exc.FashiontagError, msgspec.DecodeError):
            return
        ours = not (entry.description and task.description)
        if task.ended and (ours or task.description == entry.description):
            entry.ended, entry.done_at = str(task.task_status), None
            logger.info(
                "task %s: the service says it is %s: its rows without a result are sent again",
                entry.task_id,
                task.task_status,
                extra={"task_id": entry.task_id},
            )

    async def _first_of_each_id(
        self, entry: TaskEntry, rows: list[PageRow], *, again: bool = False
    ) -> list[PageRow]:
        """The rows whose id was written to the task and has no line for it yet (a server
        may repeat an id, in a page or across pages, or answer under an id it was never given);
        their ids are added to the task's written ids. A result under an id the service
        changed (case, spacing, Unicode form, leading zeros, a number, cut short) is taken as
        the row's whose id it stands for, when exactly one sent to the task does
        (:mod:`.idmatch`), and written under the id sent (:meth:`_changed_ids`)."""
        seen = entry.seen
        sent = entry.sent
        refused = entry.refused
        assert seen is not None
        # (A comprehension: its attribute load is specialized for the struct's slot, where
        # ``map(operator.attrgetter("id"), rows)`` looked the name up for every row.)
        listed = [r.id for r in rows]
        # The usual page (every id sent, none read yet, none twice), told by a C call over
        # the ids for each test, with no set built for the page: its ids are added to
        # ``seen``, which grows by one for each row only when no id repeats in the page.
        if (
            (sent is None or sent.issuperset(listed))
            and (not refused or refused.isdisjoint(listed))
            and seen.isdisjoint(listed)
        ):
            before = len(seen)
            seen.update(listed)
            if len(seen) - before == len(rows):
                return rows
            # An id repeated in the page: none was in ``seen`` before, so the ids just added
            # are these; taken out again for the rows to be read one by one below.
            seen.difference_update(listed)
        matches = await self._changed_ids(entry, set(listed) - sent) if sent is not None else {}
        out: list[PageRow] = []
        foreign = taken = changed = 0
        for r in rows:
            ident = r.id
            if sent is not None and ident not in sent:
                found = matches.get(ident)
                if found is None:
                    foreign += 1
                    continue
                changed += 1
                ident = found
                r = PageRow(found, r.tagging_result)
            if refused and ident in refused:
                taken += 1
            elif ident not in seen:
                seen.add(ident)
                out.append(r)
        if taken:
            logger.warning(
                "task %s: %d results came for rows the service refused when they were written"
                " (their rejects stand); left out",
                entry.task_id,
                taken,
                extra={"task_id": entry.task_id},
            )
        if changed:
            log = logger.info if self._warned_changed else logger.warning
            self._warned_changed = True
            log(
                "task %s: %d results came under an id the service changed (case, spacing,"
                " Unicode form, leading zeros, a number, cut short); each taken as the one row"
                " sent to the task whose id it stands for",
                entry.task_id,
                changed,
                extra={"task_id": entry.task_id},
            )
        if foreign:
            logger.warning(
                "task %s: %d results came under an id never sent to it; left out (the rows"
                " without a result are sent again)",
                entry.task_id,
                foreign,
                extra={"task_id": entry.task_id},
            )
        if len(rows) - len(out) > foreign + taken and not again:
            logger.warning(
                "task %s: %d results repeated an id already read; kept the first of each",
                entry.task_id,
                len(rows) - len(out) - foreign - taken,
                extra={"task_id": entry.task_id},
            )
        return out

    async def _changed_ids(self, entry: TaskEntry, unsent: set[str]) -> dict[str, str]:
        """The id sent to the task that each of ``unsent`` (ids of its results never sent to
        it) stands for, as far as one does (:class:`~.idmatch.IdMatcher`).

        An id taken as one sent cut short may be another task's result, under that row's id
        or the start of it (a service that mixes tasks up): when it is an id the run took in,
        or the start of one, other than the one of this task it would stand for, it is no
        row's (the row is sent again, rather than given another image's result). One look-up
        of the run's ids each, only for such ids."""
        matcher = entry.matcher
        if matcher is None:
            matcher = entry.matcher = IdMatcher(entry.sent or set())
        found: dict[str, str] = {}
        cut: dict[str, str] = {}
        for ident in unsent:
            sent_id, is_cut = matcher.find(ident)
            if sent_id is not None:
                (cut if is_cut else found)[ident] = sent_id
        if cut:
            db = self.journal.db

            def elsewhere() -> set[str]:
                return {
                    ident
                    for ident, sent_id in cut.items()
                    if any(
                        other != sent_id
                        for other in db.ids_starting(ident.rstrip(CUT_PAIR) or ident, 2)
                    )
                }

            others = await self.journal.run(elsewhere)
            if others:
                logger.warning(
                    "task %s: %d results came under the start of an id sent to it that is"
                    " also another id of the run, or the start of one (another task's result?);"
                    " left out (the rows without a result are sent again)",
                    entry.task_id,
                    len(others),
                    extra={"task_id": entry.task_id},
                )
            found.update((ident, cut[ident]) for ident in cut.keys() - others)
        return found
