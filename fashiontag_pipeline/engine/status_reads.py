"""The tracker's reads of tasks one by one (those missing from the task list; every watched
task when few are watched, or when the service does not give the list): concurrently, each
task on its own.

A status the service does not give (a 5xx, a 200 with the spec's failure body, a 409: a poll
asks for no results, so a conflict says nothing of ours) leaves that task unread for the poll,
not the others. Before, the poll asked again in place until the service gave it, so one task
the service could no longer describe held every other task of the run: ``run`` read nothing
more until it gave up, and the daemon (which never gives up) nothing more at all.

An unread task is on its own clock: once its status has not been given for ``give_up_after``
seconds the run stops (state saved: the same command resumes); the daemon keeps asking while
the other tasks go on. When no read of the poll was answered at all, it is the service that is
failing: the budget's backoff and give-up rule apply, as to any outage.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import anyio

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import Task
from .flow import REFUSED, TRANSIENT, FatalRunError, RetryBudget, redirect_fault, refused
from .taskbook import TaskEntry

__all__ = ["StatusReads", "drop_contradicted", "ours", "poll_fault"]

logger = logging.getLogger("fashiontag_pipeline.engine")

#: Status requests in flight at a time.
STATUS_MAX = 16

#: Seconds of a front end's 410 pages to a task's status (the service answering the rest)
#: after which the task is taken as gone when ``give_up_after`` is infinite (the daemon never
#: gives up, and would otherwise ask forever: the manifest never finished); ``run``'s default
#: ``--give-up-after``.
FRONT_END_GONE_AFTER = 120.0


def poll_fault(err: exc.ResultsNotReadyError) -> exc.ServerError:
    """A 409 to a poll (list, status): no results were asked for, so it says nothing of the
    request; a fault of the service (a gateway's conflict), asked again like a 5xx. Before,
    the first one stopped ``run`` (exit 1) and the daemon (a restart loop)."""
    return exc.ServerError(str(err), **err.answer())


class StatusReads:
    """Reads tasks' statuses, each task on its own; remembers since when each is unread."""

    def __init__(
        self,
        client: TaggerClient,
        budget: RetryBudget,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.budget = budget
        self.clock = clock
        #: Task id -> since when its status has not been given.
        self.unread_since: dict[str, float] = {}
        #: Task id -> the service's words, for the tasks whose status was answered 410 (gone:
        #: the task expired, its results with it), until the tracker takes them.
        self.gone: dict[str, str] = {}
        #: The tasks of :attr:`gone` taken so on a front end's 410 pages alone, which the
        #: tracker takes as gone only when the task list does not hold them: task id -> since
        #: when its status has been such a page (a cache's copy of the list older than that
        #: cannot show the task as it is now).
        self.paged: dict[str, float] = {}
        #: The unread tasks whose status was a front end's 410 page at their last read.
        self.paging: set[str] = set()

    async def read(
        self, task_ids: list[str], *, answered: bool
    ) -> tuple[dict[str, Task], set[str]]:
        """(the tasks read, the ids of those unread); tasks the service does not know (404)
        are in neither, nor are those it says are gone (410: :attr:`gone`). ``answered``: the
        service answered this poll already (its list)."""
        found: dict[str, Task] = {}
        failed: dict[str, exc.FashiontagError] = {}
        limiter = anyio.CapacityLimiter(STATUS_MAX)

        async def one(task_id: str) -> None:
            async with limiter:
                try:
                    task = await self.client.task_status(task_id)
                except exc.TaskNotFoundError:
                    task = None
                except exc.ResultsExpiredError as err:
                    if err.foreign and not self._gone_behind_a_front_end(task_id):
                        # (a front end's 410 page: no word of the service's, for now)
                        failed[task_id] = exc.ServerError(
                            f"{err} (not the service's answer)", **err.answer()
                        )
                        return
                    # Gone (410): the task expired, and its results cannot be read any more.
                    self.gone[task_id] = err.service_message or str(err)
                    if err.foreign:
                        self.paged[task_id] = self.unread_since.get(task_id, self.clock())
                    task = None
                except exc.ResultsNotReadyError as err:
                    failed[task_id] = poll_fault(err)
                    return
                except TRANSIENT as err:
                    failed[task_id] = err
                    return
                except REFUSED as err:
                    raise refused(err) from err
                except exc.ServiceError as err:
                    fault = redirect_fault(err)  # (a front end's, to its maintenance page)
                    if fault is None:
                        raise
                    failed[task_id] = fault
                    return
            self.unread_since.pop(task_id, None)
            if task is not None:
                found[task_id] = task

        async with anyio.create_task_group() as tg:
            for task_id in task_ids:
                tg.start_soon(one, task_id)
        answered = answered or len(failed) < len(task_ids)
        if answered:
            self.budget.ok()
        if failed:
            await self._unread(failed, answered=answered)
        return found, set(failed)

    async def _unread(self, failed: dict[str, exc.FashiontagError], *, answered: bool) -> None:
        now = self.clock()
        for task_id, err in failed.items():
            since = self.unread_since.setdefault(task_id, now)
            reason = " ".join(str(err).split())
            limited = isinstance(err, exc.RateLimitedError)
            if _front_end_gone(err):
                self.paging.add(task_id)
            else:
                self.paging.discard(task_id)
            if since == now:
                logger.warning(
                    "task %s: the service %s (%s); asked again at the next poll, the other"
                    " tasks go on",
                    task_id,
                    "is rate limiting its status (HTTP 429)"
                    if limited
                    else "does not give its status",
                    reason,
                    extra={"task_id": task_id},
                )
            elif now - since > self.budget.give_up_after and not self._page_to_give_up(err, since):
                given = "rate limited its status (HTTP 429)" if limited else "not given its status"
                raise FatalRunError(
                    f"task {task_id}: the service has {given} for"
                    f" {now - since:.0f} s (give_up_after, --give-up-after): {reason}; stopped"
                    " with the state saved: the same command resumes"
                ) from err
        if not answered:
            task_id, err = next(iter(failed.items()))
            await self.budget.failed(err, f"status of task {task_id}")

    def _gone_behind_a_front_end(self, task_id: str) -> bool:
        """Whether a front end's 410 page to ``task_id``'s status is the task gone: such pages
        for ``give_up_after`` while the service answered other requests (a front end that
        rewrites every 410, nginx's ``proxy_intercept_errors``, over a task the service
        dropped). Before, the run stopped (exit 1) and so did every resume: its rows never
        had an outcome; the daemon asked forever (``FRONT_END_GONE_AFTER`` bounds it)."""
        since = self.unread_since.get(task_id)
        limit = self.budget.give_up_after
        if math.isinf(limit):
            limit = FRONT_END_GONE_AFTER
        if since is None or self.clock() - since <= limit:
            return False
        gone = self.budget.answered_at > since
        if gone:
            logger.warning(
                "task %s: its status has been a front end's 410 page, not the service's"
                " answer, for %.0f s (past %.0f s: %s) while the service answered the rest:"
                " taken as gone",
                task_id,
                self.clock() - since,
                limit,
                "--give-up-after" if limit == self.budget.give_up_after else "the daemon's bound",
                extra={"task_id": task_id},
            )
        return gone

    def _page_to_give_up(self, err: exc.FashiontagError, since: float) -> bool:
        """Whether ``err``, a task's status unread since ``since``, is a front end's 410 page
        that :meth:`_gone_behind_a_front_end` takes as the task gone at the next poll."""
        return _front_end_gone(err) and self.budget.answered_at > since

    def keep_only(self, unread: set[str]) -> None:
        """The tasks unread at this poll: the others' clocks end (read, listed, no longer
        watched), so that a task unread again later starts a new one."""
        for task_id in set(self.unread_since) - unread:
            del self.unread_since[task_id]
        self.paging &= unread


def _front_end_gone(err: exc.FashiontagError) -> bool:
    """Whether ``err`` is a front end's 410 page (not the service's answer)."""
    return isinstance(err, exc.ServiceError) and err.status == 410 and err.foreign


def ours(entry: TaskEntry, task: Task) -> bool:
    """False when the service shows, under the task's id, a task with another description
    (a service that forgot ours and gave its id to another). No description: no evidence."""
    return not (entry.description and task.description) or task.description == entry.description


def drop_contradicted(listed: dict[str, Task], tasks: list[Task]) -> int:
    """Leave out of ``listed`` each task the list gives more than once with copies that
    differ (a list merged from replicas or shards, one of them behind): which copy is
    current cannot be told, so the poll reads that task's own status. (The last copy was
    taken: one as the task was when new held every task processing, at every poll, for
    ever.) Returns how many were left out."""
    dropped = 0
    for task in tasks:
        if listed.get(task.task_id, task) != task:
            del listed[task.task_id]
            dropped += 1
    return dropped
