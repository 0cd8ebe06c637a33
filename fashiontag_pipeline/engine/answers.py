"""What the answer to a task write changes: the chunk's rows accepted into the task (those the
service refused, as rejects), a chunk of unknown fate orphaned, a write refused whole split in
two or rejected, a create answered with a task id the run holds already (a stop), and the
per-job counts a chunk's rows add to.

:class:`WriteAnswers` is a part of :class:`~.writes.TaskWrites` (the requests are there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from .. import _exceptions as exc
from .._client import TaggerClient
from .._connect import unreadable_answer
from .._models import BulkTaskResponse, FailureItem
from .flow import FatalRunError, refused
from .idmatch import EchoedIds
from .jobs import Jobs
from .policy import Chunk, OpenTask, encode_ids, halves
from .state import POS_SHIFT, JobReject, Journal, changes
from .tracker import TaskBook

__all__ = [
    "DUPLICATE_PREFIX",
    "STAGE_SERVER",
    "WriteAnswers",
    "count_by_job",
    "job_marks",
    "no_task_id",
    "one_source",
    "task_description",
]

logger = logging.getLogger("fashiontag_pipeline.engine")

STAGE_SERVER = "server-validation"
DUPLICATE_PREFIX = "duplicate context.id"


def task_description(token: str) -> str:
    """The description a create carries: its token, by which the run finds the task of a
    create whose answer it never got."""
    return f"fashiontag run {token}"


def one_source(positions: Sequence[int], last: int) -> bool:
    """Whether every position is of one manifest (one job), ``last`` being the largest: a
    chunk almost always is, and then the per-job figures below need no loop over its rows in
    Python (min and max are C, but ~160 instructions a row each: the task writer finds it
    once for a chunk it cuts, :attr:`~.policy.Chunk.one_source`)."""
    return bool(positions) and min(positions) >> POS_SHIFT == last >> POS_SHIFT


def last_and_one(positions: Sequence[int]) -> tuple[int, bool]:
    """(the largest of ``positions``, :func:`one_source` of them) from one sorted copy: a new
    chunk's positions come in order, and ``sorted`` finds an ordered list so in one pass of its
    int comparison (~60-110 instructions a row, against ~160 for each of ``max`` and ``min``).
    Rows sent again out of order are sorted, at ~2-3x that (rarely)."""
    ordered = sorted(positions)
    last = ordered[-1]
    return last, ordered[0] >> POS_SHIFT == last >> POS_SHIFT


def count_by_job(jobs: Jobs, positions: Sequence[int], one: bool = False) -> dict[int, int]:
    """Rows per job among ``positions`` (:meth:`Jobs.count_by_job`); ``one``: they are known
    to be of one manifest (rows of a chunk that is, :attr:`~.policy.Chunk.one_source`)."""
    if positions and (one or one_source(positions, max(positions))):
        job = jobs.of_pos(positions[0])
        return {job.id: len(positions)} if job is not None else {}
    return jobs.count_by_job(positions)


def job_marks(
    jobs: Jobs, positions: Sequence[int], last: int, one: bool | None = None
) -> list[tuple[int, int]]:
    """(job, last position) of each job with rows among ``positions`` (:meth:`Jobs.marks`);
    ``last`` is their largest, which the caller has at hand (and ``one``, when it has it:
    :func:`one_source`)."""
    if one is None:
        one = one_source(positions, last)
    if one:
        job = jobs.of_pos(last)
        return [(job.id, last)] if job is not None else []
    return jobs.marks(positions)


def no_task_id() -> FatalRunError:
    """A task of the run's creates listed with an empty id (its create's answer named none):
    it cannot be addressed, nor created again (its rows would be billed twice)."""
    return FatalRunError(
        "the service lists a task this run created with an empty task id (its create's answer"
        " named none): the task cannot be addressed nor its results read; stopped with the"
        " state saved, its rows not created again (each would be billed twice). The same"
        " command resumes once the service lists the task under its id"
    )


class WriteAnswers:
    """What answers change, for :class:`~.writes.TaskWrites` (see the module docstring)."""

    client: TaggerClient
    journal: Journal
    jobs: Jobs
    book: TaskBook
    clock: Callable[[], float]
    default_ttl: float
    writes_taken: int
    sent_requests: int
    refused_writes: int
    current: OpenTask | None
    tasks: dict[str, OpenTask]
    _checking: set[str]

    @staticmethod
    def _applied_log(err: exc.AmbiguousWriteError) -> Callable[..., None]:
        """How a write applied with no readable answer is logged: a warning when its answer
        was refused unread (over max_answer_bytes: something in front of the service is
        wrong), else at info (a 204 is the service's own way)."""
        return logger.warning if unreadable_answer(err) is not None else logger.info

    async def _check_new_id(self, task_id: str, chunk: Chunk, what: str = "a create") -> None:
        """Stop the run when a create's task id (answered, or adopted from the list after an
        answer was lost) is one the run holds already. The chunk's rows went into that task
        (the service took them, and bills them): the chunk is recorded as its orphan, so the
        resume settles it from that task's results and counts this send toward
        ``max_sends``, instead of taking it for a create of unknown fate (sent again with the
        send count it had: a row billed ``max_sends + 1`` times).

        The check and the claim are one step on the event loop: two creates answered with one
        new id at the same moment each asked the state (a thread hop), neither found it, and
        both chunks went to one task. An id being checked is held in :attr:`_checking` until
        its caller attaches it (with no await between)."""
        checking = self._checking
        known = task_id in self.tasks or task_id in checking or task_id in self.book.entries
        if not known:
            checking.add(task_id)
            try:
                known = await self.journal.run(self.journal.db.task_known, task_id)
                if known and await self._purged(task_id):
                    known = False
            finally:
                checking.discard(task_id)
        if known:
            await self.journal.commit(ops=[changes.chunk_orphan(chunk.chunk_id, task_id)])
            # One id, two tasks' rows: their results, counts and expiries cannot be told
            # apart, so rows would be settled by each other's lines (some lost, some twice).
            raise FatalRunError(
                f"the service answered {what} with task id {task_id!r}, which"
                " it had given to this run before (a service that hands out a task id"
                " twice, or adds a new task's rows to another): its results cannot be"
                " read exactly once; stopped with the state saved (the same command"
                " resumes once the service gives each task its own id)"
            )

    async def _purged(self, task_id: str) -> bool:
        """Whether a task id given again names a task of this run that is finished with and
        whose results have expired (the service purged it and gave its id to a new task, as
        the spec allows): the new task takes its place (its record replaces the old one in
        the commit that opens it: ``_opened_ops``). Before, the run stopped as for an id
        handed out twice, and so did every resume."""
        now = time.time() + self.client.server_clock.correction
        if not await self.journal.run(self.journal.db.task_purged, task_id, now):
            return False
        logger.info(
            "task id %s, of a task of this run whose results have expired, names a new task",
            task_id,
            extra={"task_id": task_id},
        )
        return True

    def _expiry(self, response_expiry: datetime | None) -> float:
        # The service's expiry is in the service's clock (see ServerClock).
        return self.clock() + self.client.server_clock.remaining(response_expiry, self.default_ttl)

    async def _refused_row_by_row(
        self, task: OpenTask, chunk: Chunk, response: BulkTaskResponse
    ) -> bool:
        """True when an append answered 2xx refused every row of ``chunk`` (none as a
        duplicate): the chunk is then given back (:meth:`_give_back`) and goes to a new task,
        whose create's answer is the rows' verdict. A task that takes no more writes
        (expired: the spec does not show how a PUT after expiry is answered) may say so row
        by row, ``task has expired`` for each: before, every row became a reject."""
        if not self._refused_every_row(chunk, response):
            return False
        logger.info(
            "task %s refused every row of a write (%s): they go to a new task",
            task.task_id,
            response.failure_list[0].error_message,
            extra={"task_id": task.task_id},
        )
        await self._give_back(task, chunk)
        return True

    @staticmethod
    def _refused_every_row(chunk: Chunk, response: BulkTaskResponse) -> bool:
        """Whether a write answered 2xx refused every row of ``chunk``, none as a duplicate
        (read only when its ``failureList`` holds as many entries as the chunk has rows)."""
        failures = response.failure_list
        if len(failures) < len(chunk.ids) or chunk.fate_unknown:
            return False
        named = EchoedIds(chunk.ids)
        refused: set[str] = set()
        for failure in failures:
            if failure.error_message.startswith(DUPLICATE_PREFIX):
                return False
            ident = named(failure.context_id)
            if ident is not None:
                refused.add(ident)
        return len(refused) == len(named.mine)

    async def _give_back(self, task: OpenTask, chunk: Chunk) -> None:
        """A write to ``task`` refused, not applied: the task takes no more writes, and the
        chunk belongs to no task until it is sent again (were the task found lost meanwhile,
        its rows must not be sent again twice)."""
        self.refused_writes += 1
        task.closing = True
        if self.current is task:
            self.current = None
        chunk.task_id = None
        await self.journal.commit(ops=[changes.chunk_detached(chunk.chunk_id)])

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
        # (A subset of a chunk of one manifest is of one manifest too.)
        by_job = count_by_job(self.jobs, positions, chunk.one_source)
        return {job: {"submitted": n} for job, n in by_job.items()}

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
        named = EchoedIds(chunk.ids)  # (its set of ids built only when the service listed any)
        for failure in response.failure_list:
            ident = named(failure.context_id)
            if ident is None:
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
                extra={"task_id": task.task_id},
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

    @staticmethod
    def _listed(chunk: Chunk, failures: Sequence[FailureItem]) -> dict[str, str]:
        """The rows of ``chunk`` a refusal's ``failureList`` names, with their reasons."""
        named = EchoedIds(chunk.ids)
        listed: dict[str, str] = {}
        for failure in failures:
            ident = named(failure.context_id)
            if ident is not None:
                listed[ident] = failure.error_message or "no reason given"
        return listed

    async def _reject_chunk(
        self,
        chunk: Chunk,
        message: str,
        listed: dict[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        if listed is None:
            reasons = dict.fromkeys(chunk.ids, message)
        else:
            reasons = {i: f"refused by the service (HTTP {status}): {r}" for i, r in listed.items()}
        rejects = self._reject_rows(chunk, reasons, STAGE_SERVER)
        await self.journal.commit(
            rejects=rejects, settle=True, ops=changes.chunk_resolved(chunk.chunk_id)
        )

    async def _orphan(
        self,
        chunk: Chunk,
        *,
        ops: list[changes.Change] | None = None,
        counters: dict[str, int] | None = None,
        by_job: dict[int, dict[str, int]] | None = None,
    ) -> None:
        """Record ``chunk`` as of unknown fate in its task (settled from the task's results),
        in one transaction with ``ops`` (the task it created) and the counts given (its rows
        counted as submitted are recorded with it: the others are counted when the task
        returns them, :mod:`.returned`)."""
        assert chunk.task_id is not None
        counted = (counters or {}).get("submitted")
        await self.journal.commit(
            ops=[*(ops or ()), changes.chunk_orphan(chunk.chunk_id, chunk.task_id, counted)],
            counters=counters,
            by_job=by_job,
        )
        self.book.orphan(chunk.task_id, chunk.chunk_id)

    async def record_applied_create(self, chunk: Chunk) -> None:
        """A create of unknown fate that a resume found applied (its task listed under its
        token): its rows are in the task, submitted (as a create answered 2xx with no body,
        :meth:`~.writes.TaskWrites._created_unanswered`), and the chunk is an orphan settled
        from the task's results (a row the task does not return is sent again), never
        written to the task a second time. The caller attaches it to its task's entry."""
        assert chunk.task_id is not None
        await self.journal.commit(
            ops=[changes.chunk_orphan(chunk.chunk_id, chunk.task_id, len(chunk.ids))],
            counters={"submitted": len(chunk.ids)},
            by_job=self._submitted(chunk, {}),
        )

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
        listed = self._listed(chunk, failures) if failures else {}
        if len(listed) == len(chunk.ids):
            # Every row refused by name (STRICT's 400, a create that took none): each its
            # own reject at once, not the chunk split in halves until each row is sent alone
            # (about twice as many creates as rows, each refused again).
            await self._reject_chunk(chunk, "", listed, err.status)
            return True
        named = [f.error_message for f in failures or () if f.error_message]
        reason = named[0] if named else (err.service_message or "no reason given")
        proven = bool(named) or self.writes_taken > 0
        if len(chunk.ids) > 1 and (proven or not chunk.hold):
            parts = halves(chunk)
            stored = [
                (len(part.ids), max(part.positions), body, encode_ids(part.ids))
                for part, body in parts
            ]
            new_ids = await self.journal.run(self.journal.split_chunk, chunk.chunk_id, stored)
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
