"""The task writer's requests and what their answers change: create (POST), append (PUT),
accept (the chunk's rows in the task, those the service refused as rejects), orphan a chunk of
unknown fate, adopt a task after an ambiguous create.

:class:`TaskWrites` is the sending half of :class:`~.batcher.TaskWriter` (the other half packs
chunks and chooses their task); it holds no state of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime

import anyio

from .. import _exceptions as exc
from .._client import TaggerClient
from .._models import BulkTaskResponse, Task
from .config import EngineConfig
from .flow import AIMDLimiter, FatalRunError, RetryBudget, refused
from .jobs import Jobs
from .policy import Chunk, OpenTask, WritePolicy, encode_ids, halves
from .state import POS_SHIFT, JobReject, Journal, changes
from .tracker import TaskBook

__all__ = ["DUPLICATE_PREFIX", "STAGE_SERVER", "TaskWrites", "count_by_job", "job_marks"]

logger = logging.getLogger("fashiontag_pipeline.engine")

STAGE_SERVER = "server-validation"
DUPLICATE_PREFIX = "duplicate context.id"


def _echoed(echo: str, ids: list[str]) -> str | None:
    """The chunk's id a shortened echo stands for (a service may cut a long id in its
    ``failureList``, ending it with an ellipsis); None when none or several match. Without
    this, the refused row counted as accepted and was sent again for ever."""
    stem = echo.rstrip("…").rstrip(".")
    if not stem or stem == echo:
        return None
    found = [i for i in ids if i.startswith(stem) and len(i) > len(stem)]
    return found[0] if len(found) == 1 else None


def _one_source(positions: Sequence[int], last: int) -> bool:
    """Whether every position is of one manifest (one job), ``last`` being the largest: a
    chunk almost always is, and then the per-job figures below need no loop over its rows in
    Python (min and max are C)."""
    return bool(positions) and min(positions) >> POS_SHIFT == last >> POS_SHIFT


def count_by_job(jobs: Jobs, positions: Sequence[int]) -> dict[int, int]:
    """Rows per job among ``positions`` (:meth:`Jobs.count_by_job`)."""
    if positions and _one_source(positions, max(positions)):
        job = jobs.of_pos(positions[0])
        return {job.id: len(positions)} if job is not None else {}
    return jobs.count_by_job(positions)


def job_marks(jobs: Jobs, positions: Sequence[int], last: int) -> list[tuple[int, int]]:
    """(job, last position) of each job with rows among ``positions`` (:meth:`Jobs.marks`);
    ``last`` is their largest, which the caller has at hand."""
    if _one_source(positions, last):
        job = jobs.of_pos(last)
        return [(job.id, last)] if job is not None else []
    return jobs.marks(positions)


class TaskWrites:
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
    current: OpenTask | None
    clock: Callable[[], float]
    default_ttl: float
    refused_writes: int
    writes_taken: int
    sent_requests: int
    run_token: str
    _seq: int

    def description(self, token: str) -> str:
        return f"fashiontag run {token}"

    def _expiry(self, response_expiry: datetime | None) -> float:
        # The service's expiry is in the service's clock (see ServerClock).
        return self.clock() + self.client.server_clock.remaining(response_expiry, self.default_ttl)

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

    def _reject_rows(self, chunk: Chunk, ids: dict[str, str], stage: str) -> list[JobReject]:
        out: list[JobReject] = []
        if not ids:
            return out  # the usual write: the service took every row
        jobs = self.jobs
        for ident, pos in zip(chunk.ids, chunk.positions, strict=True):
            reason = ids.get(ident)
            if reason is not None:
                out.append(jobs.reject(pos, jobs.original(ident), reason, stage))
        return out

    def _submitted(self, chunk: Chunk, refused: dict[str, str]) -> dict[int, dict[str, int]]:
        """Rows of the chunk the service took, per job."""
        positions = chunk.positions
        if refused:
            positions = [p for i, p in zip(chunk.ids, positions, strict=True) if i not in refused]
        return {job: {"submitted": n} for job, n in count_by_job(self.jobs, positions).items()}

    async def _accept(
        self,
        task: OpenTask,
        chunk: Chunk,
        response: BulkTaskResponse,
        opened: list[changes.Change] | None = None,
    ) -> None:
        """Record an accepted write (and, with ``opened``, the task it created: one
        transaction)."""
        assert task.task_id is not None
        reasons: dict[str, str] = {}
        # The chunk's ids as a set only when the service listed failures (rarely).
        mine = set(chunk.ids) if response.failure_list else set()
        for failure in response.failure_list:
            ident = failure.context_id
            if ident is not None and ident not in mine:
                ident = _echoed(ident, chunk.ids)
            if ident is None or ident not in mine:
                continue
            if failure.error_message.startswith(DUPLICATE_PREFIX):
                continue  # a retried write: this id is already in the task
            reasons[ident] = failure.error_message or "refused by the service"
        expiry = response.expires_at
        if expiry is not None:
            task.expires = self._expiry(expiry)
        self.sent_requests += 1
        if reasons and chunk.fate_unknown and chunk.task_id == task.task_id:
            # An earlier try of this write may have been applied: a refusal of its rows may
            # only say they are in the task already, in words of the service's own (the spec
            # leaves message texts open). Their outcome comes from the task's results; a row
            # without one is sent again, where a row really refused is refused for certain.
            logger.warning(
                "task %s: %d rows of a write retried after an unanswered try were refused (%s);"
                " taken as of unknown fate: those the task returns are tagged, the others sent"
                " again",
                task.task_id,
                len(reasons),
                next(iter(reasons.values())),
            )
            if opened:
                await self.journal.commit(ops=opened, counters={"tasks": 1})
            await self._orphan(chunk)
            return
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        accepted = len(chunk.ids) - len(rejects)
        counters = {"submitted": accepted}
        if opened:
            counters["tasks"] = 1
        await self.journal.commit(
            rejects=rejects,
            settle=True,
            by_job=self._submitted(chunk, reasons),
            ops=[
                *(opened or ()),
                changes.chunk_accepted(chunk.chunk_id, task.task_id, accepted),
                changes.task_expiry(task.task_id, expiry.timestamp() if expiry else None),
            ],
            counters=counters,
        )

    async def _reject_chunk(self, chunk: Chunk, message: str) -> None:
        reasons = dict.fromkeys(chunk.ids, message)
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        await self.journal.commit(
            rejects=rejects, settle=True, ops=changes.chunk_resolved(chunk.chunk_id)
        )

    async def _orphan(
        self,
        chunk: Chunk,
        *,
        counters: dict[str, int] | None = None,
        by_job: dict[int, dict[str, int]] | None = None,
    ) -> None:
        assert chunk.task_id is not None
        await self.journal.commit(
            ops=[changes.chunk_orphan(chunk.chunk_id, chunk.task_id)],
            counters=counters,
            by_job=by_job,
        )
        self.book.orphan(chunk.task_id, chunk.chunk_id)

    def _fatal(self, err: exc.FashiontagError) -> FatalRunError:
        return refused(err)

    async def _refused_whole(self, chunk: Chunk, err: exc.RequestError) -> bool | list[Chunk]:
        """A create refused whole, nothing applied (True: settled; else the parts to send).

        400, 413 and 422 are about the request's rows or size (one element the service will
        not take, a front end's body limit): a chunk of several rows is split in two, each
        sent apart and split again if refused again, so that one row refused alone ends as its
        reject with the service's answer and the others are tagged. Any other status is about
        no row (a wrong URL, a method not taken): the run stops, its rows kept for a resume."""
        if not isinstance(err, (exc.ValidationError, exc.PayloadTooLargeError)):
            raise self._fatal(err) from err
        failures = err.failure_list if isinstance(err, exc.ValidationError) else None
        named = [f.error_message for f in failures or () if f.error_message]
        reason = named[0] if named else (err.service_message or "no reason given")
        proven = bool(named) or self.writes_taken > 0
        if len(chunk.ids) > 1 and (proven or not chunk.hold):
            parts = halves(chunk)
            stored = [
                (len(part.ids), max(part.positions), body, encode_ids(part.ids))
                for part, body in parts
            ]
            new_ids = await self.journal.run(self.journal.db.split_chunk, chunk.chunk_id, stored)
            for (part, _), new_id in zip(parts, new_ids, strict=True):
                part.chunk_id = new_id
            logger.info(
                "a write of %d rows was refused whole (HTTP %s): sent again in two parts",
                len(chunk.ids),
                err.status,
            )
            return [part for part, _ in parts]
        if not proven:
            # No write taken yet in the run: nothing says the refusal is about rows (a body
            # limit under one row, a firewall refusing every write). It waits for one to be
            # taken (TaskWriter._send), and stops the run if none is.
            chunk.waiting = f"HTTP {err.status}: {' '.join(reason.split())[:200]}"
            return [chunk]
        await self._reject_chunk(chunk, f"refused by the service (HTTP {err.status}): {reason}")
        return True

    async def _create(
        self, task: OpenTask, chunk: Chunk, token_written: bool = False
    ) -> bool | list[Chunk]:
        """POST the chunk as a new task. True when the chunk is settled, or the parts it was
        split into (:meth:`_refused_whole`). ``token_written``: the chunk's write-ahead
        recorded the task's token already."""
        if not token_written:
            await self.journal.commit(ops=[changes.chunk_token(chunk.chunk_id, task.token)])
        while True:
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
                    logger.info(
                        "a create was applied (HTTP %s) with no readable answer; its task is"
                        " found by its token",
                        err.status,
                    )
                else:
                    await self.budget.failed(err, "create task")
                adopted = await self.find_task(task.token)
                if adopted is None:
                    if err.applied:  # not listed in time: created again, after a backoff
                        await self.budget.failed(err, "create task")
                    continue
                # The id may have answered another create of the run meanwhile (a service
                # that merges creates): the same stop as for such an answer (below).
                await self._check_new_id(adopted.task_id, chunk)
                await self._opened(task, adopted.task_id, adopted.expires_at)
                chunk.fate_unknown = True
                chunk.task_id = adopted.task_id
                return False
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self.budget.failed(err, "create task")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
                raise self._fatal(err) from err
            except exc.RequestError as err:
                task.failed = True
                task.created.set()
                if self.current is task:
                    self.current = None
                return await self._refused_whole(chunk, err)
            self.budget.ok()
            self.slots.success()
            self.writes_taken += 1
            await self._check_new_id(response.task_id, chunk)
            opened = self._opened_ops(task, response.task_id, response.expires_at)
            await self._accept(task, chunk, response, opened)
            task.created.set()
            return True

    async def _check_new_id(self, task_id: str, chunk: Chunk) -> None:
        """Stop the run when a create's task id (answered, or adopted from the list after an
        answer was lost) is one the run holds already. The chunk's rows went into that task
        (the service took them, and bills them): the chunk is recorded as its orphan, so the
        resume settles it from that task's results and counts this send toward
        ``max_sends``, instead of taking it for a create of unknown fate (sent again with the
        send count it had: a row billed ``max_sends + 1`` times)."""
        if task_id in self.tasks or await self.journal.run(self.journal.db.task_known, task_id):
            await self.journal.commit(ops=[changes.chunk_orphan(chunk.chunk_id, task_id)])
            # One id, two tasks' rows: their results, counts and expiries cannot be told
            # apart, so rows would be settled by each other's lines (some lost, some twice).
            raise FatalRunError(
                f"the service answered a create with task id {task_id!r}, which"
                " it had given to this run before (a service that hands out a task id"
                " twice, or adds a new task's rows to another): its results cannot be"
                " read exactly once; stopped with the state saved (the same command"
                " resumes once the service gives each task its own id)"
            )

    def _opened_ops(
        self, task: OpenTask, task_id: str, expiry: datetime | None
    ) -> list[changes.Change]:
        """Attach a created task; the rows recording it (committed before any other write
        goes to the task: :attr:`OpenTask.created` is set after)."""
        task.task_id = task_id
        task.expires = self._expiry(expiry)
        self.tasks[task_id] = task
        stamp = expiry.timestamp() if expiry else None
        return changes.task_opened(task_id, task.seq, task.token, stamp, self._seq)

    async def _opened(self, task: OpenTask, task_id: str, expiry: datetime | None) -> None:
        await self.journal.commit(
            ops=self._opened_ops(task, task_id, expiry), counters={"tasks": 1}
        )
        task.created.set()

    async def find_task(self, token: str) -> Task | None:
        """The task whose description carries ``token`` (after an ambiguous create): see
        :meth:`find_tasks`."""
        return (await self.find_tasks({token})).get(token)

    async def find_tasks(self, tokens: Collection[str]) -> dict[str, Task]:
        """The tasks whose descriptions carry ``tokens`` (after ambiguous creates), by token.
        A token not listed within ``list_lag`` seconds of the first list is left out: a
        service's list may lag its writes, and one look cannot tell "not created" from "not
        listed yet"."""
        wanted = {self.description(token): token for token in tokens}
        found: dict[str, Task] = {}
        deadline: float | None = None
        pause = 0.25
        while True:
            listed = await self.budget.call("list tasks", self.client.all_tasks, ends_streak=False)
            for task in listed:
                token = wanted.get(task.description or "")
                if token is not None and token not in found:
                    found[token] = task
            if len(found) == len(wanted):
                return found
            now = time.monotonic()
            if deadline is None:  # from the first answer: retries of the list do not count
                deadline = now + self.config.list_lag
            if now >= deadline:
                return found
            await anyio.sleep(min(pause, deadline - now))
            pause *= 2

    async def _append(self, task: OpenTask, chunk: Chunk) -> bool:
        """PUT the chunk to ``task``. True when settled; False to re-target it."""
        assert task.task_id is not None
        while True:
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
                    logger.info(
                        "task %s: a write was applied (HTTP %s) with no readable answer; its"
                        " rows are settled from the task's results",
                        task.task_id,
                        err.status,
                    )
                    # Its rows are in the task (none was listed as refused): submitted, as
                    # those of a write answered 202, in the commit that orphans the chunk.
                    await self._orphan(
                        chunk,
                        counters={"submitted": len(chunk.ids)},
                        by_job=self._submitted(chunk, {}),
                    )
                    return True
                await self.budget.failed(err, f"append to task {task.task_id}")
                continue
            except (exc.TaskExpiredError, exc.TaskNotFoundError):
                self.refused_writes += 1
                task.closing = True
                if self.current is task:
                    self.current = None
                if chunk.fate_unknown:
                    await self._orphan(chunk)
                    return True
                # Refused, so not applied: the chunk belongs to no task until it is sent again
                # (were the task found lost meanwhile, its rows must not be re-sent twice).
                chunk.task_id = None
                await self.journal.commit(ops=[changes.chunk_detached(chunk.chunk_id)])
                return False
            except (exc.TransportError, exc.RateLimitedError, exc.ServerError) as err:
                if isinstance(err, exc.RateLimitedError):
                    self.slots.throttled()
                await self.budget.failed(err, f"append to task {task.task_id}")
                continue
            except (exc.AuthenticationError, exc.PermissionDeniedError) as err:
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
                )
                self.refused_writes += 1
                task.closing = True
                if self.current is task:
                    self.current = None
                chunk.task_id = None
                await self.journal.commit(ops=[changes.chunk_detached(chunk.chunk_id)])
                return False
            self.budget.ok()
            self.slots.success()
            self.writes_taken += 1
            await self._accept(task, chunk, response)
            return True
