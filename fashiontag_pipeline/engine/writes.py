"""The task writer's requests: create (POST), append (PUT), adopt a task after an ambiguous
create (found in the task list by its token).

:class:`TaskWrites` is the sending half of :class:`~.batcher.TaskWriter` (the other packs
chunks and chooses their task); it holds no state. What an answer changes (a chunk accepted,
refused rows as rejects, an orphan, a write refused whole split) is :mod:`.answers`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection
from datetime import datetime

import anyio

from .. import _exceptions as exc
from .._callctx import WRITE_AGAIN, WRITES_STOPPED
from .._client import TaggerClient
from .._models import Task
from .answers import (
    DUPLICATE_PREFIX,
    STAGE_SERVER,
    count_by_job,
    job_marks,
    no_task_id,
    task_description,
)
from .config import EngineConfig
from .flow import STILL_FAILING_EVERY, AIMDLimiter, FatalRunError, RetryBudget, stale_list
from .jobs import Jobs
from .moves import MOVED, WriteMoves
from .policy import Chunk, OpenTask, WritePolicy
from .state import Journal, changes
from .tracker import TaskBook

__all__ = ["DUPLICATE_PREFIX", "STAGE_SERVER", "TaskWrites", "count_by_job", "job_marks"]

logger = logging.getLogger("fashiontag_pipeline.engine")


class TaskWrites(WriteMoves):
    """Requests to the service for :class:`~.batcher.TaskWriter` (see the module docstring)."""

    client: TaggerClient
    journal: Journal
    config: EngineConfig
    policy: WritePolicy
    jobs: Jobs
    book: TaskBook
    budget: RetryBudget
    slots: AIMDLimiter
    tasks: dict[str, OpenTask]
    _checking: set[str]
    current: OpenTask | None
    clock: Callable[[], float]
    default_ttl: float
    refused_writes: int
    writes_taken: int
    sent_requests: int
    run_token: str
    _seq: int

    def description(self, token: str) -> str:
        return "" if token.endswith(MOVED) else task_description(token)

    def _new_token(self) -> tuple[int, str]:
        self._seq += 1
        return self._seq, f"{self.run_token}-t{self._seq}"

    @staticmethod
    def token_seq(token: str) -> int:
        """The sequence number in a token of :meth:`_new_token` (ValueError if none)."""
        _, sep, seq = token.rpartition("-t")
        if not sep:
            raise ValueError(f"not a task token: {token!r}")
        return int(seq)

    def _now(self) -> changes.Stamp:
        return self.journal.db.wall(), self.client.server_clock.stamp()

    @staticmethod
    def _stopped() -> bool:
        """Whether the run starts no new write (a drain, :data:`~.._callctx.WRITES_STOPPED`): a
        write refused (not applied), or not sent yet, is left to the resume (written ahead)."""
        stopped = WRITES_STOPPED.get()
        return stopped is not None and stopped.is_set()

    async def _failed(self, err: BaseException, what: str) -> None:
        """:meth:`RetryBudget.failed` for a write, its wait ended by a stop."""
        await self.budget.failed(err, what, until=WRITES_STOPPED.get())

    async def _create(
        self, task: OpenTask, chunk: Chunk, token_written: bool = False
    ) -> bool | list[Chunk]:
        """POST the chunk as a new task. True when the chunk is settled (or left to the
        resume: :meth:`_stopped`), or the parts it was split into (:meth:`_refused_whole`).
        ``token_written``: the chunk's write-ahead recorded the task's token already."""
        recorded = token_written  # (the state holds this create's token for the chunk)
        if not token_written and not self._stopped():
            now = self._now()  # (the state's clock and the service's, as every chunk time)
            await self.journal.commit(ops=[changes.chunk_token(chunk.chunk_id, task.token, now)])
            recorded = True
        retry, unknown = False, changes.NEVER  # (unknown: when the last unknown send left)
        while True:
            if self._stopped():  # not created: a chunk waiting for the task goes on
                if recorded and not retry:  # (never sent: a resume need not wait for it)
                    await self.journal.commit(ops=[changes.chunk_sending(chunk.chunk_id, unknown)])
                task.failed = True
                task.created.set()
                if self.current is task:
                    self.current = None
                return True
            sent = self._now()  # (a resume looks for it that long: see late_look)
            if retry:
                await self.journal.commit(ops=[changes.chunk_sending(chunk.chunk_id, sent)])
            retry = True

            async def again() -> None:  # (the client sends it again itself: after a 429)
                nonlocal sent
                sent = self._now()
                await self.journal.commit(ops=[changes.chunk_sending(chunk.chunk_id, sent)])

            hook = WRITE_AGAIN.set(again)
            try:
                response = await self.client.create_task(
                    chunk.requests,
                    description=self.description(task.token),
                    default_detection=self.config.default_detection,
                )
            except exc.AmbiguousWriteError as err:
                if err.applied:
                    # Answered 2xx (applied) with no readable body (204 No Content, ...): a
                    # success, not a failure to retry; its task is looked up by token at once.
                    self.budget.ok()
                    self.slots.success()
                    self.writes_taken += 1
                    self._applied_log(err)(
                        "a create was applied (HTTP %s) with no readable answer; its task is"
                        " found by its token (%s)",
                        err.status,
                        err,
                    )
                    await self._created_unanswered(task, chunk, err.status)
                    return True
                unknown = sent
                await self._failed(err, "create task")
                late = err.unanswered_for  # (a create that slow may be applied as late)
                adopted = None if self._stopped() else await self._find_unless_stopped(task, late)
                if adopted is None:
                    continue
                # The id may have answered another create of the run meanwhile (a service
                # that merges creates): the same stop as for such an answer (below).
                await self._check_new_id(adopted.task_id, chunk)
                await self._opened(task, adopted.task_id, adopted.expires_at)
                chunk.fate_unknown = True
                chunk.task_id = adopted.task_id
                return False
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, (exc.ConnectError, exc.RateLimitedError, exc.ServerError)):
                    # Not applied (never delivered, or answered so): the state's time goes
                    # back to the last send of unknown fate (0: none, not waited for).
                    await self.journal.commit(ops=[changes.chunk_sending(chunk.chunk_id, unknown)])
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self._failed(err, "create task")
                continue
            except (exc.TLSError, exc.AuthenticationError, exc.PermissionDeniedError) as err:
                # The run stops; this create was never taken (a handshake that failed, a key
                # refused): a resume need not wait for it, only for an earlier unknown send.
                await self.journal.commit(ops=[changes.chunk_sending(chunk.chunk_id, unknown)])
                if isinstance(err, exc.TLSError):
                    raise
                raise self._fatal(err) from err
            except exc.RequestError as err:
                task.failed = True
                task.created.set()
                if self.current is task:
                    self.current = None
                return await self._refused_whole(chunk, err)
            finally:
                WRITE_AGAIN.reset(hook)
            self.budget.ok()
            self.slots.success()
            self.writes_taken += 1
            await self._check_new_id(response.task_id, chunk)
            opened = self._opened_ops(task, response.task_id, response.expires_at)
            await self._accept(task, chunk, response, opened)
            task.created.set()
            return True

    async def _created_unanswered(self, task: OpenTask, chunk: Chunk, status: int | None) -> None:
        """Settle a create answered 2xx with no readable body: applied, its task id unknown.

        Its task is looked for by token until listed: not created again when the list lags
        (its rows would be billed twice, though the answer said they were taken). Once found,
        the chunk is settled as an append answered so: its rows are in the task (submitted),
        an orphan settled from the task's results (a row the task does not return is sent
        again), not written to the task a second time. A task never listed within
        ``give_up_after`` stops the run with the state saved."""
        adopted = await self._find_applied(task.token, status)
        await self._check_new_id(adopted.task_id, chunk)
        chunk.task_id = adopted.task_id
        chunk.fate_unknown = True
        ops = self._opened_ops(task, adopted.task_id, adopted.expires_at)
        await self._orphan(
            chunk,
            ops=ops,
            counters={"tasks": 1, "submitted": len(chunk.ids)},
            by_job=self._submitted(chunk, {}),
        )
        task.created.set()

    async def _find_applied(self, token: str, status: int | None) -> Task:
        """The task of an applied create (see :meth:`_created_unanswered`), looked for again
        at growing intervals (each look waits up to ``list_lag``) until ``give_up_after`` has
        gone by since the answer: then FatalRunError (not a create again)."""
        started = time.monotonic()
        limit = self.budget.give_up_after
        warned: float | None = None
        pause = 0.25
        while True:
            found = await self.find_task(token)
            if found is not None:
                if warned is not None:
                    logger.info(
                        "the task of a create applied with no answer is listed after %.0f s",
                        time.monotonic() - started,
                    )
                return found
            now = time.monotonic()
            if now - started >= limit:
                raise FatalRunError(
                    f"a create was applied (HTTP {status}) with no readable answer and its"
                    f" task ({self.description(token)!r}) was never listed by the service in"
                    f" {limit:.0f} s (give_up_after, --give-up-after): its id cannot be learnt"
                    " nor its results read; stopped with the state saved, its rows not created"
                    " again (each would be billed twice). The same command resumes: it looks"
                    " for the task again, and sends the rows again only if it is still not"
                    " listed"
                )
            if warned is None or now - warned >= STILL_FAILING_EVERY:
                warned = now
                logger.warning(
                    "a create was applied (HTTP %s) with no readable answer and its task is"
                    " not listed after %.0f s; looked for again%s, not created again",
                    status,
                    now - started,
                    "" if math.isinf(limit) else f" for up to {limit:.0f} s",
                )
            await anyio.sleep(min(pause, max(0.0, limit - (now - started))))
            pause = min(pause * 2, 5.0)

    def _opened_ops(
        self, task: OpenTask, task_id: str, expiry: datetime | None
    ) -> list[changes.Change]:
        """Attach a created task; the rows recording it (committed before any other write
        goes to the task: :attr:`OpenTask.created` is set after)."""
        task.task_id = task_id
        task.answered = self.clock()
        task.expires = self._expiry(expiry)
        self.tasks[task_id] = task
        stamp = expiry.timestamp() if expiry else None
        purged = changes.task_purged(task_id)  # (a purged task's, its id given again: _purged)
        return [purged, *changes.task_opened(task_id, task.seq, task.token, stamp, self._seq)]

    async def _opened(self, task: OpenTask, task_id: str, expiry: datetime | None) -> None:
        ops = self._opened_ops(task, task_id, expiry)
        await self.journal.commit(ops=ops, counters={"tasks": 1})
        task.created.set()

    async def _find_unless_stopped(self, task: OpenTask, late: float) -> Task | None:
        """:meth:`find_task` (``late``: its ``lag``) after a create of unknown fate, or None once
        the run stops writing (a drain): a look-up kept waiting (a task list rate limited or
        shedding load) ends at the stop, the chunk (its token written ahead) left to the resume."""
        stopped = WRITES_STOPPED.get()
        if stopped is None:
            return await self.find_task(task.token, late)
        found: list[Task | None] = [None]
        failed: list[Exception] = []
        async with anyio.create_task_group() as tg:

            async def look() -> None:
                try:
                    found[0] = await self.find_task(task.token, late)
                except Exception as err:  # raised below as itself, not in a group
                    failed.append(err)
                tg.cancel_scope.cancel()

            tg.start_soon(look)
            await stopped.wait()
            tg.cancel_scope.cancel()
        if failed:
            raise failed[0]
        return found[0]

    async def find_task(self, token: str, lag: float = 0.0) -> Task | None:
        """The task whose description carries ``token`` (after an ambiguous create): see
        :meth:`find_tasks`."""
        return (await self.find_tasks({token}, lag)).get(token)

    async def find_tasks(self, tokens: Collection[str], lag: float = 0.0) -> dict[str, Task]:
        """The tasks whose descriptions carry ``tokens`` (after ambiguous creates), by token.
        A token not listed within ``list_lag + lag`` seconds of the first list is left out: a
        service's list may lag its writes, and one look cannot tell "not created" from "not
        listed yet" (``lag`` down to ``-list_lag``: one look)."""
        wanted = {self.description(token): token for token in tokens}
        found: dict[str, Task] = {}
        deadline: float | None = None
        pause = 0.25
        while True:
            listed = await self.budget.call("list tasks", self.client.all_tasks, ends_streak=False)
            for task in listed:
                token = wanted.get(task.description or "")
                if token is not None and not task.task_id:
                    raise no_task_id()
                if token is not None and token not in found:
                    found[token] = task
            if len(found) == len(wanted):
                return found
            now = time.monotonic()
            if deadline is None:  # from the first answer: retries of the list do not count
                deadline = now + self.config.list_lag + lag
            if now - self.client.list_age >= deadline:  # (a cache's copy: the list as it was)
                return found
            if now - deadline > self.budget.give_up_after:
                raise stale_list(self.client.list_age, self.budget.give_up_after)
            await anyio.sleep(min(pause, deadline - now) if now < deadline else pause)
            pause = min(pause * 2, 5.0)  # (a look of a minute: listed again every 5 s)

    async def _append(self, task: OpenTask, chunk: Chunk) -> bool:
        """PUT the chunk to ``task``. True when settled (or left to the resume:
        :meth:`_stopped`); False to re-target it."""
        assert task.task_id is not None
        while True:
            if self._stopped():
                return True
            if not self.policy.writable(task, self.clock()):
                task.closing = True
                if chunk.fate_unknown and chunk.task_id == task.task_id:
                    await self._orphan(chunk)
                    return True
                return False
            if chunk.task_id != task.task_id:
                chunk.task_id = task.task_id
                chunk.fate_unknown = False
                await self.journal.commit(ops=[changes.chunk_task(chunk.chunk_id, task.task_id)])
            try:
                response = await self.client.append_to_task(
                    task.task_id, chunk.requests, default_detection=self.config.default_detection
                )
            except exc.AmbiguousWriteError as err:
                chunk.fate_unknown = True
                if err.applied:
                    # Answered 2xx (applied) with no readable body (204 No Content, ...):
                    # sending it again would only be answered so again. Its rows the task
                    # returns are tagged; the others are sent again when it is read.
                    self.budget.ok()
                    self.slots.success()
                    self.writes_taken += 1
                    self._applied_log(err)(
                        "task %s: a write was applied (HTTP %s) with no readable answer; its"
                        " rows are settled from the task's results (%s)",
                        task.task_id,
                        err.status,
                        err,
                        extra={"task_id": task.task_id},
                    )
                    # Its rows are in the task (none was listed as refused): submitted, as
                    # those of a write answered 202, in the commit that orphans the chunk.
                    await self._orphan(
                        chunk,
                        counters={"submitted": len(chunk.ids)},
                        by_job=self._submitted(chunk, {}),
                    )
                    return True
                await self._failed(err, f"append to task {task.task_id}")
                continue
            except (exc.TaskExpiredError, exc.TaskNotFoundError, exc.PermissionDeniedError) as err:
                if isinstance(err, exc.PermissionDeniedError):  # (about the task, not the
                    # key: one closed to writes; the next create judges the key, fatal there)
                    logger.info("task %s refused a write (%s): to a new task", task.task_id, err)
                if not chunk.fate_unknown:
                    await self._give_back(task, chunk)  # refused, so not applied
                    return False
                self.refused_writes += 1
                task.closing = True
                if self.current is task:
                    self.current = None
                await self._orphan(chunk)
                return True
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self._failed(err, f"append to task {task.task_id}")
                continue
            except exc.AuthenticationError as err:
                raise self._fatal(err) from err
            except exc.RequestError as err:
                if chunk.fate_unknown:
                    # An earlier try may have been applied; a service may refuse the retry
                    # whole (every row a duplicate). Not an outcome: see _accept.
                    logger.warning(
                        "task %s: a write retried after an unanswered try was refused (%s);"
                        " its rows taken as of unknown fate: those the task returns are"
                        " tagged, the others sent again",
                        task.task_id,
                        err.service_message or err,
                        extra={"task_id": task.task_id},
                    )
                    await self._orphan(chunk)
                    return True
                # Refused whole, not applied (a 400 or 409 for a task that takes no more
                # writes, a body too large, a status the spec does not show): not the rows'
                # outcome. Sent again to a new task, whose create's answer decides.
                logger.info(
                    "task %s refused a write whole (HTTP %s): its rows go to a new task",
                    task.task_id,
                    err.status,
                    extra={"task_id": task.task_id},
                )
                await self._give_back(task, chunk)
                return False
            self.budget.ok()
            self.slots.success()
            self.writes_taken += 1
            moved = response.task_id and response.task_id != task.task_id
            if moved and await self._moved(task, chunk, response):  # (another task took them)
                return True
            if response.failure_list and await self._refused_row_by_row(task, chunk, response):
                return False  # every row refused: sent again to a new task
            await self._accept(task, chunk, response)
            return True
