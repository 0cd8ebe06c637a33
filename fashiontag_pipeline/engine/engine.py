"""The engine: one long-lived pipeline that takes jobs (sets of manifests) as they come.

::

    jobs --RowBatch--> intake --[Item]--> TaskWriter --POST/PUT--> service
    (round robin,        |   (validate,       |  (chunks, rotation,     |
     fairness gate)      |    dedupe, route)  |   expiry guard)         |
                       rejects             TaskBook <--- Tracker (list, status)
                                              |
    job outputs <-- Journal <-- ResultPagers <+  (done tasks; Resend -> writer)
                       ^
    intake --[SingleItem]--> SingleRouter --POST /tagger/v2/tags--> service

The whole life is one task group (:meth:`Engine.__aenter__` starts every stage in it, beside
the caller's block, whose code runs on after the engine's normal end (:mod:`.ending`);
:meth:`Engine.__aexit__` waits for it). Stages are linked by bounded memory streams (source ->
intake -> writer, intake -> single router) and by narrow public methods of the objects they
share: the :class:`~.tracker.TaskBook` of tasks past the writer (:meth:`~.tracker.TaskBook.watch`,
:meth:`~.tracker.TaskBook.orphan`, :meth:`~.tracker.TaskBook.retire`), the pagers' ``add`` for
done tasks and the writer's ``resend`` for rows without an outcome. One client session, one task
rotation, one concurrency budget and one state store serve every job; :meth:`Engine.submit`
adds a job at any time and :meth:`Engine.outcome` waits until every row of it has its outcome.

``fashiontag run`` is one job (:func:`~.run.run_pipeline`); the daemon one per manifest.
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import AsyncExitStack, suppress
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from .._callctx import GIVE_UP, WRITES_STOPPED
from .._client import TaggerClient
from .._models import format_time
from .batcher import TaskWriter
from .config import EngineConfig
from .ending import cancel_when, end, finish, watch_control
from .flow import FatalRunError, RetryBudget, RunControl
from .intake import Idle, intake
from .jobs import IdSpace, Job, JobEnd, Jobs, JobSpec
from .outcome import finalize_job, open_job
from .pagers import ResultPagers
from .policy import Chunk
from .resume import reattach_unless_stopped
from .rows import RowBatch
from .scheduler import JobSource
from .settle import TaskSettler
from .single import SingleRouter
from .source import ManifestReader
from .state import Journal, Reconciliation, RunState, StateStore
from .state.store import JobRow
from .statekeep import keep_state
from .submits import NOT_STARTED, RUNS_ONCE, Submits
from .tracker import TaskBook, Tracker
from .validate import Item, SingleItem, Validator

if TYPE_CHECKING:
    from .reuse import ReuseHook  # (only a run with --reuse loads it)

__all__ = ["Engine", "RunControl"]

logger = logging.getLogger("fashiontag_pipeline.engine")


def _reset(var: ContextVar[Any], token: Token[Any]) -> None:
    """Put a context variable back (a no-op when the engine is closed from another context
    than the one that opened it)."""
    with suppress(ValueError):
        var.reset(token)


class Engine:
    """The pipeline of :mod:`this module <.engine>`, for as long as the ``async with`` lasts.

    ``namespaced``: several jobs may be in flight, so ids are sent as ``JOB/ID``
    (:class:`~.jobs.IdSpace`). ``fail_fast``: a manifest that breaks while it is read ends
    the engine (``run``); otherwise only its job fails (the daemon). ``max_pending_rows``:
    the source waits while more rows than this are taken in without an outcome, so a job
    submitted later reaches the service within seconds (None: no bound). ``reuse``: the result
    store of ``--reuse`` (:class:`~.reuse.ReuseHook`; None: every row is sent); ``keep_state``:
    keep the state's lock file while it runs (:mod:`.statekeep`; the daemon keeps its own)."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        db: StateStore,
        state: RunState,
        config: EngineConfig,
        namespaced: bool = False,
        control: RunControl | None = None,
        fail_fast: bool = True,
        max_pending_rows: int | None = None,
        reuse: ReuseHook | None = None,
        keep_state: bool = True,
    ) -> None:
        self.client = client
        self.config = config
        self.state = state
        self.control = control or RunControl()
        self.jobs = Jobs(IdSpace(namespaced))
        self.reuse, self.keep_state = reuse, keep_state
        self.journal = Journal(
            db,
            self.jobs,
            fsync_seconds=config.fsync_seconds,
            reuse=reuse,
            keep_lost=not fail_fast,
        )
        self.journal.counters = dict(state.counters)
        self.budget = RetryBudget(
            config.give_up_after, max_retry_after=client.retry.max_retry_after
        )
        self.book = TaskBook()
        self.validator = Validator()
        self.writer = TaskWriter(
            client=client,
            journal=self.journal,
            config=config,
            run_token=state.token,
            task_seq=state.task_seq,
            jobs=self.jobs,
            book=self.book,
            budget=self.budget,
        )
        self.settler = TaskSettler(
            journal=self.journal,
            jobs=self.jobs,
            book=self.book,
            resend=self.writer.resend,
            max_sends=config.max_sends,
        )
        self.pagers = ResultPagers(
            client=client,
            journal=self.journal,
            book=self.book,
            config=config,
            budget=self.budget,
            settler=self.settler,
            finished=self.finished,
        )
        self.tracker = Tracker(
            client=client,
            journal=self.journal,
            book=self.book,
            config=config,
            budget=self.budget,
            on_done=self.pagers.add,
            finished=self.finished,
            polled=lambda: self.journal.run(self.jobs.made_again),
        )
        self.single = SingleRouter(
            client=client,
            journal=self.journal,
            config=config,
            budget=self.budget,
            jobs=self.jobs,
            on_idle=self.book.poke,
        )
        self.started = time.monotonic()
        self.source = JobSource(
            book=self.book,
            pending=self.rows_pending,
            in_flight=self._in_flight,
            fail_fast=fail_fast,
            max_pending_rows=max_pending_rows,
        )
        #: Every pipeline stage ended with nothing in flight (the engine was closed).
        self.complete = False
        #: Stopped from outside (drain or abort) before it was complete.
        self.interrupted = False
        #: The state store's check at the end (None until the engine has ended).
        self.reconciliation: Reconciliation | None = None
        self.submits = Submits(
            journal=self.journal,
            jobs=self.jobs,
            source=self.source,
            config=config,
            register=self._register,
        )
        self._stack: AsyncExitStack | None = None
        self._outer: anyio.abc.TaskGroup | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._entered = self._began = False
        #: Every stage has ended (see :mod:`.ending`).
        self.ended = anyio.Event()

    # -------------------------------------------------------------- life

    async def __aenter__(self) -> Engine:
        if self._began:  # (its state is closed as it ends: "the state is closed" said less)
            raise RuntimeError(RUNS_ONCE)
        self._began = True
        stack = AsyncExitStack()
        await stack.__aenter__()
        # Every stage's requests start no retry past the run's give-up point, nor of a write
        # once stopped (the stages' tasks take this context with them).
        given_up = GIVE_UP.set(self.budget.time_left)
        stack.callback(_reset, GIVE_UP, given_up)
        stopped = WRITES_STOPPED.set(self.control.stopping)
        stack.callback(_reset, WRITES_STOPPED, stopped)
        try:
            for row in await self.journal.run(self.journal.db.open_jobs):
                await self._register(row)
            self._outer = await stack.enter_async_context(anyio.create_task_group())
            await self._outer.start(self._life)
        except BaseException:
            # The stages already started wait for work that will never come: without the
            # cancel, closing the task group waits for them for ever.
            if self._outer is not None:
                self._outer.cancel_scope.cancel()
            try:
                await stack.aclose()
            finally:  # the state and any output opened: a caller's cancel lands here too
                await finish(anyio.to_thread.run_sync, self.journal.close)
            raise
        self._stack = stack
        self._entered = self.submits.running = True
        if self.interrupted and self.ended.is_set():
            self._outer.cancel_scope.cancel()  # stopped while it started: the block ends
        return self

    async def _life(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """The stages, in a task group of their own (see :mod:`.ending`)."""
        started = False
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for job in self.jobs.by_id.values():
                    tg.start_soon(self._finalize_when_settled, job)
                await self._start(tg)
                task_status.started()
                started = True
        finally:
            self._tg = None  # (a submit under way registers its job unwatched: it stays open)
            self.ended.set()
        if not started:  # stopped while the stages started
            task_status.started()
        # Stopped from outside: the caller's block ends too (once it has begun).
        if self.interrupted and self._entered and self._outer is not None:
            self._outer.cancel_scope.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.close()
        assert self._stack is not None
        # A stop from outside arrives as a cancellation (see :mod:`.ending`); any other
        # exception means a stage died.
        cancelled = anyio.get_cancelled_exc_class()
        failed = exc_type is not None and not issubclass(exc_type, cancelled)
        try:
            return await self._stack.__aexit__(exc_type, exc_value, tb)
        except BaseException as err:
            failed = failed or not isinstance(err, cancelled)
            raise
        finally:
            self.source.close_readers()
            # Finished whatever cancels the caller: an engine cancelled from outside still
            # reconciles, flushes and closes every open job's outputs and the state store.
            await finish(end, self, failed)

    def close(self) -> None:
        """No more jobs: the engine ends once every job in flight is complete."""
        self.source.close()

    async def wait(self) -> None:
        """Until the engine ends (closed and finished, or stopped from outside: that end
        cancels the ``async with`` block, which then exits normally)."""
        if not self._entered:
            raise RuntimeError(NOT_STARTED)
        await self.ended.wait()

    async def _start(self, tg: anyio.abc.TaskGroup) -> None:
        self.writer.attach(tg)
        pending: list[Chunk] = []
        if self.state.resumed:
            found = await reattach_unless_stopped(self, self.control.stopping, tg)
            if found is None:
                logger.warning("stopped while resuming; the same command resumes")
                self.interrupted = True
                tg.cancel_scope.cancel()
                return
            pending = found
        pending_singles = await self.single.load_pending()
        q = self.config.queue_batches  # (made once nothing before their stages can cancel)
        raw_send, raw_recv = anyio.create_memory_object_stream[RowBatch | JobEnd | Idle](q)
        item_send, item_recv = anyio.create_memory_object_stream[list[Item]](q)
        single_send, single_recv = anyio.create_memory_object_stream[list[SingleItem]](q)
        tg.start_soon(watch_control, self, tg)
        if self.keep_state:
            tg.start_soon(keep_state, self.journal.db)
        self.writer.active += 1  # held until the resumed chunks are dispatched
        tg.start_soon(self.writer.run, item_recv)
        try:
            for chunk in pending:
                await self.writer.start(chunk)
        except BaseException:  # (cancelled: their stages never start)
            for stream in (raw_send, raw_recv, item_send, single_send, single_recv):
                stream.close()
            raise
        self.writer.active -= 1
        tg.start_soon(self.source.run, raw_send)
        tg.start_soon(self.single.run, single_recv, pending_singles)
        stage = functools.partial(
            intake, validator=self.validator, journal=self.journal, jobs=self.jobs, reuse=self.reuse
        )
        tg.start_soon(stage, raw_recv, item_send, single_send)
        await self.writer.seal_idle()
        tg.start_soon(self._track_and_page, tg)

    async def _track_and_page(self, tg: anyio.abc.TaskGroup) -> None:
        async with anyio.create_task_group() as inner:
            inner.start_soon(self.tracker.run)
            inner.start_soon(self._poke_on_idle)
            await self.pagers.run()
        self.complete = self.finished()
        tg.cancel_scope.cancel()

    async def _poke_on_idle(self) -> None:
        await self.writer.idle.wait()
        self.book.poke()

    def finished(self) -> bool:
        """True once the engine is closed, every job read, and nothing is in flight."""
        w = self.writer
        book = self.book
        return (
            self.source.done
            and w.intake_done
            and w.active == 0
            and book.unfinished() == 0
            and book.orphans_pending == 0
            and not book.orphans_by_task
            and self.single.idle.is_set()
        )

    # -------------------------------------------------------------- jobs

    async def _register(self, row: JobRow) -> Job:
        """A job's outputs opened (:func:`~.outcome.open_job`) and its completion watched."""
        job = await open_job(self.journal, row, self.jobs.ids)
        self.jobs.add(job)
        if self._tg is not None:
            self._tg.start_soon(self._finalize_when_settled, job)
        return job

    async def submit(self, spec: JobSpec, readers: list[ManifestReader] | None = None) -> Job:
        """Add a job (resumed when the state holds one of ``spec.key``). Its manifests are
        opened first (``readers``: already opened, in order): one that cannot be read raises
        :class:`~fashiontag_pipeline.ManifestError`. A submit that cannot be honoured (see
        :mod:`.submits`) raises :class:`~fashiontag_pipeline.StateConflictError`, for outputs
        that cannot be opened :class:`~fashiontag_pipeline.StateError`, for an output on a
        manifest or the state file :class:`~fashiontag_pipeline.ConfigError`, outside the
        ``async with`` block ``RuntimeError``; nothing is recorded. A submit under way when the
        engine is closed still has its job read."""
        return await self.submits.submit(spec, readers)

    async def _finalize_when_settled(self, job: Job) -> None:
        await job.settled.wait()
        with anyio.CancelScope(shield=True):
            stamp = format_time(datetime.now(UTC))
            await self.journal.run(finalize_job, self.journal, job, stamp, self.jobs.ids.namespaced)
            self.jobs.remove(job)
            job.row.state = "complete"
            job.row.completed_at = stamp
            job.finalized.set()
            self.book.poke()

    async def outcome(self, job: Job) -> Job:
        """Wait until every row of ``job`` has its outcome written, fsync-ed, and its
        outputs closed. An engine that ended (closed) before raises :class:`FatalRunError`:
        the job is open in the state, and an engine opened on it again finishes it."""
        if not job.finalized.is_set():
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when, self.ended, tg.cancel_scope)
                await job.finalized.wait()
                tg.cancel_scope.cancel()
        if not job.finalized.is_set():
            why = "rows without an outcome" if job.submitted else "it was not submitted"
            raise FatalRunError(
                f"job {job.row.key!r} is not complete: the engine ended ({why}); submit it to"
                " an engine opened on the same state to finish it"
            )
        return job

    def job_of_key(self, key: str) -> Job | None:
        """The job in flight of ``key`` (one the state held open when the engine started, or
        one submitted since), None when there is none."""
        return self.jobs.of_key(key)

    def active_jobs(self) -> list[Job]:
        return list(self.jobs.by_id.values())

    def _in_flight(self) -> bool:
        """Whether something under way can still bring rows to an outcome (a write, an open
        or watched task, a single-mode request)."""
        w = self.writer
        return (
            w.slots.inflight > 0
            or bool(w.tasks)
            or self.book.unfinished() > 0
            or self.single.inflight > 0
        )

    def rows_pending(self) -> int:
        """Rows taken in without an outcome yet, over every job."""
        c = self.journal.counters
        return c.get("accepted", 0) - c.get("settled", 0)

    # -------------------------------------------------------------- reporting

    @property
    def rows_read(self) -> int:
        return self.source.rows_read

    def bytes_read(self) -> int:
        return self.source.bytes_read()

    def bytes_total(self) -> int:
        return self.source.bytes_total()

    def tasks_live(self) -> int:
        return self.book.unfinished() + len(self.writer.tasks)
