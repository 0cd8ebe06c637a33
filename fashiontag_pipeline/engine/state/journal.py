"""The journal: the one thread that writes sinks and state, each commit one transaction.

:meth:`Journal.commit` writes a page's results and/or rejects to the sinks, then in one SQLite
transaction applies the state changes (:mod:`.changes`), adds to the counters and records the
sinks' new byte checkpoints, so a resume truncates the outputs to exactly what the state
knows. Everything runs in one long-lived thread (:class:`~.worker.StateThread`), so the event
loop never blocks on disk. Taking a validated batch in (the run-wide dedupe) is :mod:`.intake`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..pages import PageRow, count_outcomes
from ..sinks import Reject, ReusedLine
from .changes import Change
from .intake import Intake, JobReject
from .refusal_marks import RefusalMarks
from .schema import COUNTERS, JOB_COUNTERS
from .sent_ids import SentIds
from .store import StateStore
from .worker import StateThread

if TYPE_CHECKING:
    from ..jobs import Job, Jobs

__all__ = ["JobReject", "Journal", "ReuseLedger"]

T = TypeVar("T")


class StoredAnswer(Protocol):
    """A stored result (:class:`~..reuse.StoredResult`)."""

    @property
    def task_id(self) -> str: ...

    @property
    def result(self) -> bytes: ...


class ReuseLedger(Protocol):
    """What the journal asks of ``--reuse`` (:class:`~..reuse.ReuseHook`), in its thread:
    which kept rows of a batch are answered from the result store (``settle``, in the intake
    transaction: rows to send, (index, stored result) of the others, state changes) and what a
    committed results page stores (``store_page``: the state changes that go with it)."""

    def settle(
        self,
        db: sqlite3.Connection,
        job: int,
        plan: Any,
        keyed: Sequence[tuple[str, int]],
        keep: list[int],
        replay_upto: int,
    ) -> tuple[list[int], Sequence[tuple[int, StoredAnswer]], list[Change]]: ...

    def store_page(
        self, db: sqlite3.Connection, task_id: str, rows: list[PageRow]
    ) -> list[Change]: ...


class Journal(Intake):
    """Owns the state DB and the sinks; every call runs in the one state thread.

    :meth:`commit` writes sink bytes, then in one transaction applies state changes, adds to
    the counters and records the new sink checkpoints.
    """

    def __init__(
        self,
        db: StateStore,
        jobs: Jobs,
        *,
        fsync_seconds: float = 1.0,
        reuse: ReuseLedger | None = None,
        keep_lost: bool = False,
    ) -> None:
        db.claim(self)  # (one engine per store)
        self.db = db
        self.jobs = jobs
        self.fsync_seconds = fsync_seconds
        #: Outputs removed under a job fail the job (else the run stops): Job.check_outputs.
        self.keep_lost = keep_lost
        #: ``--reuse``: the result store's side of intake and page commits (None: off).
        self.reuse = reuse
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._thread = StateThread()
        self._last_fsync = time.monotonic()
        self._closed = False
        #: Each chunk written ahead by this process: the open jobs' rejects checkpoints then.
        #: The service's refusals of its rows are written after them, so a scan for them
        #: starts there rather than at the start of the file (thread side; :mod:`.refusal_marks`).
        self.reject_marks = RefusalMarks(db.live_chunks)
        #: The ids each chunk written ahead by this process sends, until its task's draining
        #: reads them (:mod:`.sent_ids`: not read back from the state; thread side).
        self.sent_ids = SentIds(db.live_chunks)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the state thread. A SQLite error there is the state file's (a
        SQLite results sink raises OSError naming its own file): it is named, since "disk
        I/O error" alone does not say which file is full."""
        try:
            return await self._thread.run(fn, *args)
        except sqlite3.Error as err:
            where = self.db.where
            if where in str(err):
                raise
            raise type(err)(f"{where}: {err}") from err

    # -------------------------------------------------------------- thread side

    def _begun(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a transaction begun here and rolled back if it raises; ``fn``
        commits it itself, so that the in-memory counters move only once it is committed.

        The transaction begins before any sink byte is written: a backend that fences its
        writes (PostgreSQL, several daemons) refuses here, with nothing written, once the
        state was taken over."""
        self.db.begin()
        try:
            return fn(*args)
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):  # never in place of the error itself
                self.db.rollback()
            raise
        except BaseException:
            self.db.rollback()
            raise

    def _apply(
        self,
        page: tuple[str | None, list[PageRow]] | None,
        rejects: Sequence[JobReject],
        ops: Sequence[Change],
        counters: dict[str, int],
        by_job: dict[int, dict[str, int]] | None,
        settle: bool,
        page_job: int | None,
        reused: tuple[int, list[ReusedLine]] | None = None,
        all_success: bool = False,
    ) -> tuple[int, int, set[int]]:
        jobs = self.jobs
        counters = dict(counters)
        per_job: dict[int, dict[str, int]] = {}
        for jid, c in (by_job or {}).items():
            if (found := jobs.by_id.get(jid)) is not None and not found.closed:
                per_job[jid] = {k: v for k, v in c.items() if k in JOB_COUNTERS}
        ok = bad = 0
        touched: dict[int, Job] = {}
        job_tasks: list[tuple[int, str]] = []
        if (
            reused is not None
            and reused[1]
            and (owner := jobs.by_id.get(reused[0])) is not None
            and not owner.closed
        ):
            # --reuse: rows answered from the result store, accepted and settled together.
            jid, lines = reused
            target = jobs.by_id[jid]
            target.results.write_reused(lines)
            c = per_job.setdefault(jid, {})
            c["settled"] = c.get("settled", 0) + len(lines)
            c["reused"] = c.get("reused", 0) + len(lines)
            counters["settled"] = counters.get("settled", 0) + len(lines)
            counters["reused"] = counters.get("reused", 0) + len(lines)
            touched[jid] = target
        if page is not None:
            task_id, rows = page
            if self.reuse is not None and task_id is not None:  # --reuse: store the results
                ops = [*ops, *self.reuse.store_page(self.db.db, task_id, rows)]
            for jid, jrows in jobs.group_rows(rows, page_job).items():
                target = jobs.by_id[jid]
                target.results.write_page(task_id, jrows)
                j_ok, j_bad = (len(jrows), 0) if all_success else count_outcomes(jrows)
                ok += j_ok
                bad += j_bad
                c = per_job.setdefault(jid, {})
                c["tagged"] = c.get("tagged", 0) + j_ok
                c["failed"] = c.get("failed", 0) + j_bad
                c["settled"] = c.get("settled", 0) + len(jrows)
                if task_id is not None:
                    c["pages"] = c.get("pages", 0) + counters.get("pages", 0)
                    job_tasks.append((jid, task_id))
                touched[jid] = target
            counters["tagged"] = counters.get("tagged", 0) + ok
            counters["failed"] = counters.get("failed", 0) + bad
            counters["settled"] = counters.get("settled", 0) + ok + bad
        if rejects:
            grouped: dict[int, list[Reject]] = {}
            for jid, reject in rejects:
                grouped.setdefault(jid, []).append(reject)
            written = 0
            for jid, part in grouped.items():
                found = jobs.by_id.get(jid)
                if found is None or found.closed:
                    continue  # a row of no job in flight: its job is complete already
                target = found
                target.rejects.write_rejects(part)
                written += len(part)
                c = per_job.setdefault(jid, {})
                c["rejected"] = c.get("rejected", 0) + len(part)
                if settle:
                    c["settled"] = c.get("settled", 0) + len(part)
                touched[jid] = target
            counters["rejected"] = counters.get("rejected", 0) + written
            if settle:
                counters["settled"] = counters.get("settled", 0) + written
        now = time.monotonic()
        fsync = now - self._last_fsync >= self.fsync_seconds
        if fsync:
            self._last_fsync = now
        for target in touched.values():
            if fsync:  # removed since the last fsync: lines went too
                target.check_outputs(keep_lost=self.keep_lost)
            target.results.flush(fsync)
            target.rejects.flush(fsync)
        db = self.db
        for sql, args in ops:
            db.db.execute(sql, args)
        if job_tasks:
            db.db.executemany(
                "INSERT INTO job_tasks VALUES (?, ?) ON CONFLICT DO NOTHING", job_tasks
            )
        for key, delta in counters.items():
            if delta:
                db.db.execute(
                    "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + ? AS TEXT) WHERE key = ?",
                    (delta, f"n_{key}"),
                )
        for jid, c in per_job.items():
            moved = [(k, v) for k, v in c.items() if v]
            sinks = touched.get(jid)
            sets = [f"{k} = {k} + ?" for k, _ in moved]
            params: list[Any] = [v for _, v in moved]
            if sinks is not None:
                sets += ["results_ckpt = ?", "rejects_ckpt = ?"]
                params += [sinks.results.checkpoint(), sinks.rejects.checkpoint()]
            if sets:
                db.db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE job = ?", (*params, jid))
        db.commit()
        for key, delta in counters.items():
            if delta:
                self.counters[key] = self.counters.get(key, 0) + delta
        for jid, c in per_job.items():
            found = jobs.by_id.get(jid)
            if found is not None:
                jc = found.counters
                for key, delta in c.items():
                    jc[key] = jc.get(key, 0) + delta
        return ok, bad, set(per_job)

    # -------------------------------------------------------------- async side

    async def commit(
        self,
        *,
        page: tuple[str | None, list[PageRow]] | None = None,
        rejects: Sequence[JobReject] = (),
        ops: Sequence[Change] = (),
        counters: dict[str, int] | None = None,
        by_job: dict[int, dict[str, int]] | None = None,
        settle: bool = False,
        page_job: int | None = None,
        all_success: bool = False,
    ) -> tuple[int, int]:
        """Write a results page and/or rejects, apply ``ops``, add ``counters``; one
        transaction. Returns (tagged, failed) of the page.

        Each page row goes to its job's results (by its sent id; ``page_job``: all of them
        are that job's, with their own ids: the single endpoint, whose task id is None), each
        reject to its job's rejects. ``settle``: the rejects are outcomes of rows taken in
        (refused by the service, expired, single-mode failures). ``by_job`` adds counters of
        :data:`JOB_COUNTERS` to jobs' own (``counters`` are engine-wide). ``all_success``: the
        caller found every page row a success (:func:`~..pages.screen`), so they are not
        classified again."""
        ok, bad, touched = await self.run(
            self._begun,
            self._apply,
            page,
            rejects,
            ops,
            counters or {},
            by_job,
            settle,
            page_job,
            None,
            all_success,
        )
        self.jobs.check(touched)
        return ok, bad

    def close_job_outputs(self, job: Job) -> None:
        """Flush, fsync and close a job's outputs (thread side); later commits leave it out.

        Each output is closed even when the other's flush fails (an fsync refused at the end):
        the first error is raised, and the job, closed, is not closed again by :meth:`close`
        (a second flush of a closed file hid that error behind a ValueError, and an output
        left open kept its lock from the next run of the process)."""
        if job.closed:
            return
        job.closed = True
        error: BaseException | None = None
        for sink in (job.results, job.rejects):
            try:
                sink.flush(True)
            except BaseException as err:
                error = error or err
            finally:
                sink.close()
        if error is not None:
            raise error

    def close(self) -> None:
        """Flush and close every open job's outputs and the state (from any thread, once the
        loop is done)."""
        if self._closed:
            return
        self._closed = True
        self._thread.stop()  # after the calls handed to it
        try:
            for job in list(self.jobs.by_id.values()):
                self.close_job_outputs(job)
        finally:
            self.db.close()
            self.db.claim(None)

    def _open_jobs(self) -> list[Job]:
        """The jobs whose outputs are open (thread side): a copy, since the event loop adds
        and removes jobs meanwhile, without those closed already (complete, not yet removed)."""
        return [job for job in list(self.jobs.by_id.values()) if not job.closed]

    def task_ids(self, task_id: str) -> set[str]:
        """Ids (as sent) of the lines written for ``task_id``, in every open job's results
        (thread side; a scan: only on a resume that had read part of the task)."""
        out: set[str] = set()
        for job in self._open_jobs():
            out.update(self.jobs.ids.sent(job.id, i) for i in job.results.task_ids(task_id))
        return out

    def written_among(self, ids: set[str]) -> set[str]:
        """Which of ``ids`` (manifest ids) have a line in an open job's results or rejects
        (thread side; a scan of the outputs: only for a chunk whose task is unknown)."""
        found: set[str] = set()
        for job in self._open_jobs():
            found |= job.results.ids_among(ids) | job.rejects.ids_among(ids)
        return found

    def refused_ids(
        self, stage: str, among: Container[str] | None, since: dict[int, int] | None = None
    ) -> set[str]:
        """Ids (as sent) among ``among`` (a task's; None: every id) of the rejects written at
        ``stage`` in every open job (thread side; a scan of the rejects, from each job's
        checkpoint in ``since`` when given: :meth:`refusal_marks`). Only those are kept: a
        run whose service refused most rows held them all, per task."""
        out: set[str] = set()
        sent = self.jobs.ids.sent
        for job in self._open_jobs():
            key = job.id
            start = since.get(key, 0) if since is not None else 0
            out.update(
                ident
                for ident in (sent(key, i) for i in job.rejects.ids_of_stage(stage, start))
                if among is None or ident in among
            )
        return out

    def refusal_marks(
        self, task_id: str, chunk_ids: Sequence[int] | None = None
    ) -> dict[int, int] | None:
        """Where in each job's rejects the service's refusals of the task's rows can begin
        (thread side): the earliest checkpoints of its chunks' writes, taken (forgotten:
        the task is read once); None when a chunk of it was written ahead by an earlier
        process (its refusals may be anywhere). A service that refused rows of every task
        made each task's read scan every reject of the run: tasks x rejects. ``chunk_ids``:
        the task's chunks, when the caller has read them."""
        if chunk_ids is None:
            chunk_ids = self.db.task_chunk_ids(task_id)
        return self.reject_marks.take(chunk_ids)

    async def write_ahead(
        self,
        n: int,
        last_pos: int,
        body: bytes,
        replaces: int | None,
        resent: int,
        marks: Sequence[tuple[int, int]] = (),
        *,
        token: str | None = None,
        task_id: str | None = None,
        ids: bytes | None = None,
        sent: Sequence[str] | None = None,
        service: float | None = None,
    ) -> int:
        """Write a chunk ahead of its request (see :meth:`StateStore.insert_chunk`); ``sent``:
        its ids (those ``ids`` encodes), kept for its task's draining (:attr:`sent_ids`)."""

        def insert() -> int:
            chunk_id = self.db.insert_chunk(
                n,
                last_pos,
                body,
                replaces,
                resent,
                marks,
                token=token,
                task_id=task_id,
                ids=ids,
                service=service,
            )
            mark = {j.id: j.rejects.checkpoint() for j in self._open_jobs()}
            self.reject_marks.keep(chunk_id, mark, replaces)
            self.sent_ids.keep(chunk_id, sent, replaces)
            if resent:
                self.counters["resent"] = self.counters.get("resent", 0) + resent
            return chunk_id

        return await self.run(insert)

    def split_chunk(
        self, chunk_id: int, parts: Sequence[tuple[int, int, bytes, bytes]]
    ) -> list[int]:
        """:meth:`StateStore.split_chunk` (thread side); the new chunks' ids are not kept, and
        what was kept of the chunk split goes (it is read no more: its halves are)."""
        new = self.db.split_chunk(chunk_id, parts)
        self.reject_marks.drop(chunk_id)
        self.sent_ids.drop(chunk_id)
        for part in new:
            self.sent_ids.keep(part, None)
            self.reject_marks.drop(part)  # (a stale one: the id of a chunk gone, given again)
        return new
