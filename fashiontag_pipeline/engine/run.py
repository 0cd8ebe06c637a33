"""The run: one anyio task group wiring source -> validate -> writer -> tracker -> pagers.

::

    manifests --RowBatch--> validate --[Item]--> TaskWriter --POST/PUT--> service
                               |                     |                      |
                             rejects            (sealed tasks)          Tracker (list)
                                                                           |
                     sinks <-- Journal <-- ResultPagers <--(done tasks)----+
                                  ^
    validate --[SingleItem]--> SingleRouter --POST /tagger/v2/tags--> service
                 (local files, data: URIs; at most ``single_concurrency`` at a time)

Streams between stages are bounded (``queue_batches`` batches), so a slow service slows the
source down instead of filling memory. :func:`run_pipeline` is the Python API; the CLI and the
benchmark harness both call it, and a long-lived daemon can run one per manifest set with a
shared client.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig
from .._models import format_time
from .batcher import TaskWriter
from .config import EngineConfig, RunSummary
from .flow import FatalRunError, RetryBudget
from .gcpolicy import tune_gc
from .intake import intake
from .manifests import fingerprint
from .outcome import already_complete, open_sinks
from .pagers import ResultPagers
from .resume import reattach
from .reuse import ReuseHook, open_reuse
from .single import SingleRouter
from .source import ManifestReader, RowBatch, iter_batches, manifests_size, open_manifest
from .state import Journal, Reconciliation, RunState, StateDB
from .tracker import TaskBook, TaskEntry, Tracker
from .validate import Item, SingleItem, Validator

__all__ = ["RunControl", "default_state_path", "run_pipeline"]

logger = logging.getLogger("fashiontag_pipeline.engine")


def default_state_path(out: Path) -> Path:
    """The state file used when none is given: next to the output."""
    return out.with_name(out.name + ".state")


class RunControl:
    """Stops a run from outside (signals, a daemon's shutdown).

    :meth:`stop` stops intake, lets in-flight writes finish, saves state and ends the run
    (a later run with the same state resumes); :meth:`abort` ends it at once (state is
    consistent at every commit, so this is safe too)."""

    def __init__(self) -> None:
        self.stopping = anyio.Event()
        self.aborting = anyio.Event()

    def stop(self) -> None:
        self.stopping.set()

    def abort(self) -> None:
        self.stopping.set()
        self.aborting.set()


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    for err in group.exceptions:
        if isinstance(err, BaseExceptionGroup):
            return first_error(err)
        if isinstance(err, exc.FashiontagError):
            return err
    return group.exceptions[0]


async def run_pipeline(
    manifests: Sequence[str | Path],
    *,
    client: ClientConfig | TaggerClient,
    out: Path,
    rejects: Path,
    state: Path | None = None,
    engine: EngineConfig = EngineConfig(),  # noqa: B008 - frozen value object
    progress: bool = False,
    control: RunControl | None = None,
    restart: bool = False,
    resume_stdin: bool = False,
) -> RunSummary:
    """Tag every image of ``manifests`` into ``out`` (results) and ``rejects``; exactly once.

    Re-running with the same ``state`` file resumes an interrupted run of the same manifests
    (content fingerprints; stdin only with ``resume_stdin``); after a completed run it does
    nothing for the same manifests and starts a new run for others; ``restart`` discards
    whatever the state holds. Returns the summary, ``complete`` only when the state store shows
    every row taken in with an outcome; raises :class:`ManifestError` (before any request) for
    an unreadable manifest, :class:`StateConflictError` (touching nothing) for an unfinished
    state of other manifests, and :class:`FatalRunError` when the run cannot go on (state
    saved).
    """
    started = time.monotonic()
    names = [str(m) for m in manifests]
    if not names:
        raise exc.ManifestError("no manifest given")
    state_path = state or default_state_path(out)
    prints = [await anyio.to_thread.run_sync(fingerprint, name) for name in names]
    readers: list[ManifestReader] = []
    try:
        for i, name in enumerate(names):
            readers.append(
                await anyio.to_thread.run_sync(open_manifest, name, i, engine.read_batch_rows)
            )
    except BaseException:
        for reader in readers:
            reader.close()
        raise

    def close_readers() -> None:
        for reader in readers:
            reader.close()

    try:
        db = StateDB(state_path)
    except BaseException:
        close_readers()
        raise
    try:
        run = db.open_run(prints, restart=restart, resume_stdin=resume_stdin)
        if run.opened == "complete":
            db.close()
            close_readers()
            return already_complete(run, out, rejects, state_path, started)
        result_sink, reject_sink = open_sinks(out, rejects, engine, run)
    except BaseException:
        db.close()
        close_readers()
        raise
    try:
        reuse = open_reuse(  # --reuse: None without a store
            engine,
            language=client.language,
            db=db.db,
            resumed=run.resumed,
            state_path=str(state_path),
        )
    except BaseException:
        result_sink.close()
        reject_sink.close()
        db.close()
        close_readers()
        raise
    journal = Journal(db, result_sink, reject_sink, fsync_seconds=engine.fsync_seconds, reuse=reuse)
    journal.counters = dict(run.counters)

    own_client = isinstance(client, ClientConfig)
    tagger = TaggerClient(config=client) if isinstance(client, ClientConfig) else client
    control = control or RunControl()
    summary = RunSummary(
        resumed=run.resumed,
        opened=run.opened,
        note=run.note,
        out=str(out),
        rejects=str(rejects),
        state=str(state_path),
    )
    engine_run = EngineRun(tagger, journal, engine, run, names, readers, control, summary)
    engine_run.reuse = reuse
    restore_gc = tune_gc()
    try:
        if progress:
            from .progress import show_progress

            async with show_progress(engine_run.snapshot, interval=engine.progress_seconds):
                await engine_run.run()
        else:
            await engine_run.run()
        await engine_run.reconcile()
    except BaseExceptionGroup as group:
        err = first_error(group)
        raise err from None
    finally:
        restore_gc()
        close_readers()
        # Shielded: a run cancelled from outside (a caller's timeout, a daemon's drain) still
        # flushes and closes its sinks and state.
        with anyio.CancelScope(shield=True):
            if own_client:
                await tagger.aclose()
            await anyio.to_thread.run_sync(journal.close)
            if reuse is not None:
                await anyio.to_thread.run_sync(reuse.close_store)
        summary.elapsed_s = round(time.monotonic() - started, 3)
        engine_run.fill(summary)
    return summary


class EngineRun:
    def __init__(
        self,
        client: TaggerClient,
        journal: Journal,
        config: EngineConfig,
        run: RunState,
        names: list[str],
        readers: list[ManifestReader],
        control: RunControl,
        summary: RunSummary,
    ) -> None:
        self.client = client
        self.journal = journal
        self.config = config
        self.state = run
        self.names = names
        self.readers = readers
        self.control = control
        self.summary = summary
        self.budget = RetryBudget(config.give_up_after)
        self.book = TaskBook()
        self.validator = Validator()
        self.orphans_by_task: dict[str, set[int]] = {}
        self.writer = TaskWriter(
            client=client,
            journal=journal,
            config=config,
            run_token=run.token,
            task_seq=run.task_seq,
            sources=names,
            budget=self.budget,
            on_sealed=self.watch_sealed,
            on_orphan=self.note_orphan,
        )
        self.tracker = Tracker(
            client=client,
            journal=journal,
            book=self.book,
            config=config,
            budget=self.budget,
            on_done=self._done,
            finished=self._finished,
        )
        self.pagers = ResultPagers(
            client=client,
            journal=journal,
            book=self.book,
            config=config,
            budget=self.budget,
            sources=names,
            resend=self._resend,
            finished=self._finished,
        )
        self.single = SingleRouter(
            client=client,
            journal=journal,
            config=config,
            budget=self.budget,
            on_idle=self.book.poke,
        )
        self.started = time.monotonic()
        self.reconciliation: Reconciliation | None = None
        self.rows_read = 0
        self.complete = False
        self.interrupted = False
        self.reuse: ReuseHook | None = None

    # -------------------------------------------------------------- wiring callbacks

    async def watch_sealed(self, task_id: str, description: str) -> None:
        """A sealed task: the tracker watches it from now on."""
        orphans = self.orphans_by_task.pop(task_id, set())
        self.book.add(TaskEntry(task_id, orphans=orphans, description=description))

    def note_orphan(self, task_id: str, chunk_id: int) -> None:
        """A chunk of unknown fate whose task no longer takes writes: settled once the
        task's results are read."""
        self.orphans_by_task.setdefault(task_id, set()).add(chunk_id)
        self.book.orphans_pending += 1
        entry = self.book.entries.get(task_id)
        if entry is not None:
            entry.orphans.add(chunk_id)

    async def _done(self, entry: TaskEntry) -> None:
        await self.pagers.add(entry)

    async def _resend(self, items: list[Item], chunk_id: int) -> None:
        for start in range(0, len(items), self.config.chunk_size):
            part = items[start : start + self.config.chunk_size]
            await self.writer.dispatch(part, chunk_id=chunk_id if start == 0 else None, resent=True)

    def _finished(self) -> bool:
        w = self.writer
        return (
            w.intake_done
            and w.active == 0
            and self.book.unfinished() == 0
            and self.book.orphans_pending == 0
            and not self.orphans_by_task
            and self.single.idle.is_set()
        )

    # -------------------------------------------------------------- stages

    async def _source(self, send: anyio.abc.ObjectSendStream[RowBatch]) -> None:
        async with send:
            for reader in self.readers:
                async for batch in iter_batches(reader):
                    self.rows_read += len(batch.rows)
                    await send.send(batch)

    # -------------------------------------------------------------- resume

    # -------------------------------------------------------------- the run

    async def run(self) -> None:
        q = self.config.queue_batches
        raw_send, raw_recv = anyio.create_memory_object_stream[RowBatch](q)
        item_send, item_recv = anyio.create_memory_object_stream[list[Item]](q)
        single_send, single_recv = anyio.create_memory_object_stream[list[SingleItem]](q)
        async with anyio.create_task_group() as tg:
            self.writer.attach(tg)
            pending = await reattach(self) if self.state.resumed else []
            pending_singles = await self.single.load_pending()
            source_scope = anyio.CancelScope()

            async def source() -> None:
                with source_scope:
                    await self._source(raw_send)
                await raw_send.aclose()

            async def watch() -> None:
                await self.control.stopping.wait()
                self.interrupted = True
                source_scope.cancel()
                async with anyio.create_task_group() as inner:

                    async def until_idle() -> None:
                        await self.writer.idle.wait()
                        await self.single.idle.wait()
                        inner.cancel_scope.cancel()

                    inner.start_soon(until_idle)
                    await self.control.aborting.wait()
                    inner.cancel_scope.cancel()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            self.writer.active += 1  # held until the resumed chunks are dispatched
            tg.start_soon(self.writer.run, item_recv)
            for chunk in pending:
                await self.writer.start(chunk)
            self.writer.active -= 1
            tg.start_soon(source)
            tg.start_soon(self.single.run, single_recv, pending_singles)
            tg.start_soon(
                functools.partial(
                    intake,
                    validator=self.validator,
                    journal=self.journal,
                    names=self.names,
                    chunked=self.state.chunked,
                    validated=self.state.validated,
                    reuse=self.reuse,
                ),
                raw_recv,
                item_send,
                single_send,
            )
            await self.writer.seal_idle()
            tg.start_soon(self._track_and_page, tg)

    async def _track_and_page(self, tg: anyio.abc.TaskGroup) -> None:
        async with anyio.create_task_group() as inner:
            inner.start_soon(self.tracker.run)
            inner.start_soon(self._poke_on_idle)
            await self.pagers.run()
        self.complete = self._finished()
        tg.cancel_scope.cancel()

    async def _poke_on_idle(self) -> None:
        await self.writer.idle.wait()
        self.book.poke()

    # -------------------------------------------------------------- reporting

    def snapshot(self) -> dict[str, int]:
        c = self.journal.counters
        return {
            "rows_read": self.rows_read,
            "submitted": c.get("submitted", 0),
            "tagged": c.get("tagged", 0) + c.get("failed", 0) + c.get("reused", 0),
            "rejected": c.get("rejected", 0),
            "pages": c.get("pages", 0),
            "single": c.get("single", 0),
            "tasks_live": self.book.unfinished() + len(self.writer.tasks) - self._writer_sealed(),
            "retries": self.client.stats.retries + self.budget.retries,
            "rate_limited": self.client.stats.rate_limited,
            "bytes_read": sum(r.bytes_read for r in self.readers),
            "bytes_total": manifests_size(self.readers),
        }

    def _writer_sealed(self) -> int:
        return sum(1 for t in self.writer.tasks.values() if t.sealed)

    async def reconcile(self) -> None:
        """The end-of-run check: complete only when every row taken in has an outcome and
        nothing is in flight; then the state records it (the same manifests again: nothing to
        do)."""
        db = self.journal.db
        self.reconciliation = await self.journal.run(db.reconcile)
        done = self.complete and not self.interrupted and self.reconciliation.complete
        if self.complete and not self.interrupted and not done:
            logger.error(
                "run incomplete: %d rows have no outcome (%s)",
                self.reconciliation.unsettled,
                "; ".join(self.reconciliation.in_flight) or "counts differ",
            )
        self.complete = done
        if done:
            stamp = format_time(datetime.now(UTC))
            await self.journal.run(db.mark_complete, stamp)

    def fill(self, summary: RunSummary) -> None:
        c = self.journal.counters
        summary.rows_read = self.rows_read
        summary.submitted = c.get("submitted", 0)
        summary.tagged = c.get("tagged", 0)
        summary.failed = c.get("failed", 0)
        summary.rejected = c.get("rejected", 0)
        summary.reused = c.get("reused", 0)
        summary.tasks = c.get("tasks", 0)
        summary.pages = c.get("pages", 0)
        summary.single = c.get("single", 0)
        stats = self.client.stats
        summary.retries = stats.retries + self.budget.retries
        summary.rate_limited = stats.rate_limited
        summary.ambiguous_writes = stats.ambiguous_writes
        summary.expired_writes = self.writer.refused_writes
        summary.complete = self.complete and not self.interrupted
        summary.interrupted = self.interrupted and not self.complete
        summary.lost_tasks = c.get("lost_tasks", 0)
        summary.resent = c.get("resent", 0)
        if self.reconciliation is not None:
            summary.unsettled = self.reconciliation.unsettled
            summary.in_flight = list(self.reconciliation.in_flight)
        clock = self.client.server_clock
        if clock.known:
            summary.server_clock_offset_s = round(clock.correction, 1)
        if summary.elapsed_s > 0:
            summary.rows_per_s = round(self.rows_read / summary.elapsed_s, 1)


def summary_json(summary: RunSummary) -> bytes:
    return msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n"


__all__ += ["FatalRunError", "summary_json"]
