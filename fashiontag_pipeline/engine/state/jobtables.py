"""The ``jobs`` table: each job's sources, outputs, watermarks, checkpoints and counters.

:class:`JobTables` is a part of :class:`~.store.StateStore` (same connection, same thread): a
job is found by its key (the same key again resumes it), created with fresh source indexes,
listed while open (a restarted engine resumes them first) and marked complete. A state file of
the version before jobs had one run whose watermarks and counters were in ``meta``: it becomes
the job ``run``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from ... import _exceptions as exc
from .schema import JOB_COUNTERS, POS_SHIFT

__all__ = ["JobRow", "JobTables"]


class JobRow(msgspec.Struct, kw_only=True):
    """A job as the state file records it (see :mod:`.schema`): its sources as
    ``[[source index, manifest name], ...]``, watermarks, sink checkpoints and counters."""

    job: int
    key: str
    name: str
    sources: list[tuple[int, str]]
    results: str
    rejects: str
    sink: str
    state: str
    validated: int
    chunked: int
    results_ckpt: int
    rejects_ckpt: int
    counters: dict[str, int]
    completed_at: str | None = None
    resumed: bool = False
    #: Why the job's manifests could not be read to the end (recorded when it completes).
    failure: str | None = None
    #: Rows read from its manifests (recorded when it completes).
    rows_read: int = 0


#: The meta key of how the state's ids are sent: ``namespaced`` (``JOB/ID``, an engine made
#: with namespaced=True) or ``plain`` (as they are). A state written before it has none.
ID_SPACE = "id_space"

#: The meta key of a job's manifest fingerprints (followed by the job number).
_PRINTS = "job_prints:"

_JOB_COLUMNS = (
    "job, key, name, sources, results, rejects, sink, state, validated, chunked, results_ckpt,"
    " rejects_ckpt, " + ", ".join(JOB_COUNTERS) + ", completed_at, failure, rows_read"
)
_sources_decoder = msgspec.json.Decoder(list[tuple[int, str]])


class JobTables:
    """The job half of the state store (mixed into :class:`~.store.StateStore`)."""

    db: Any
    where: str

    def begin(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def rollback(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (a fenced backend checks its lease at its start): committed
        when the block ends, rolled back when it raises."""
        self.begin()
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def meta(self, key: str, default: str | None = None) -> str | None:
        raise NotImplementedError

    def _forget_ids(self, job: int) -> None:
        """Delete the ids of ``job`` (``JOB/ID``), in the open transaction."""
        self.db.execute("DELETE FROM ids WHERE id >= ? AND id < ?", (f"{job}/", f"{job}0"))

    def set_meta(self, key: str, value: object) -> None:
        raise NotImplementedError

    def _job_row(self, row: tuple[Any, ...]) -> JobRow:
        n = len(JOB_COUNTERS)
        return JobRow(
            job=row[0],
            key=row[1],
            name=row[2],
            sources=_sources_decoder.decode(row[3]),
            results=row[4],
            rejects=row[5],
            sink=row[6],
            state=row[7],
            validated=row[8],
            chunked=row[9],
            results_ckpt=row[10],
            rejects_ckpt=row[11],
            counters=dict(zip(JOB_COUNTERS, row[12 : 12 + n], strict=True)),
            completed_at=row[12 + n],
            failure=row[13 + n],
            rows_read=row[14 + n],
        )

    def find_job(self, key: str) -> JobRow | None:
        self._migrate_run_job()
        row = self.db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE key=?", (key,)).fetchone()
        return None if row is None else self._job_row(row)

    def open_jobs(self) -> list[JobRow]:
        """Jobs not yet complete (a restarted engine resumes them before anything else)."""
        self._migrate_run_job()
        rows = self.db.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state='open' ORDER BY job"
        ).fetchall()
        return [self._job_row(r) for r in rows]

    def open_job(
        self,
        key: str,
        name: str,
        manifests: Sequence[str],
        results: str,
        rejects: str,
        sink: str,
        prints: str | None = None,
    ) -> JobRow:
        """The job ``key``: resumed (``resumed``) when the state has it, else new, with
        fresh source indexes and its manifests' fingerprints (``prints``, JSON: see
        :meth:`job_prints`). Its output paths are the ones given now."""
        found = self.find_job(key)
        if found is not None:
            if (found.results, found.rejects, found.sink) != (results, rejects, sink):
                with self.transaction():
                    self.db.execute(
                        "UPDATE jobs SET results=?, rejects=?, sink=? WHERE job=?",
                        (results, rejects, sink, found.job),
                    )
                found.results, found.rejects, found.sink = results, rejects, sink
            found.resumed = True
            return found
        with self.transaction():
            first = int(self.meta("next_source", "0") or 0)
            sources = [(first + i, m) for i, m in enumerate(manifests)]
            self.set_meta("next_source", first + len(sources))
            self.db.execute(
                "INSERT INTO jobs (key, name, sources, results, rejects, sink)"
                " VALUES (?,?,?,?,?,?)",
                (key, name, msgspec.json.encode(sources).decode(), results, rejects, sink),
            )
            found = self.find_job(key)
            assert found is not None
            if prints is not None:
                self.set_meta(f"{_PRINTS}{found.job}", prints)
        return found

    def check_id_space(self, row: JobRow, namespaced: bool) -> None:
        """Record how the engine opening ``row`` sends ids (``namespaced``), or refuse one of
        the other setting on a job that took rows in under the recorded one
        (:class:`StateConflictError`, nothing written): its ids are recorded, and its lines
        checked, as sent, so that engine would take its outputs for another run's. A state
        written before the record is left as it was."""
        want = "namespaced" if namespaced else "plain"
        recorded = self.meta(ID_SPACE)
        if recorded == want or (recorded is None and row.validated >= 0):
            return
        if row.validated >= 0:
            made = recorded == "namespaced"
            raise exc.StateConflictError(
                f"{self.where} holds the unfinished job {row.key!r}, begun by an Engine made"
                f" with namespaced={made} (ids sent {'as JOB/ID' if made else 'as they are'});"
                f" this Engine was made with namespaced={namespaced}, and would not know its"
                f" ids nor its lines: open the state with an Engine made with namespaced={made}"
                " to finish it (nothing was changed)"
            )
        with self.transaction():
            self.set_meta(ID_SPACE, want)

    def job_prints(self, job: int) -> str | None:
        """The fingerprints of a job's manifests as recorded when it was made (JSON), None for
        a job made without them (by a version before them, or ``run``, which checks its
        manifests for the whole state)."""
        return self.meta(f"{_PRINTS}{job}")

    def _migrate_run_job(self) -> None:
        """A state file of a version before jobs: its run becomes the job ``run`` (its
        watermarks, checkpoints and counters were in ``meta``)."""
        if self.meta("validated") is None:
            return
        names = msgspec.json.decode(self.meta("manifests") or "[]", type=list[str])
        counters = [int(self.meta(f"n_{k}", "0") or 0) for k in JOB_COUNTERS]
        with self.transaction():
            self.db.execute(
                "INSERT INTO jobs (job, key, name, sources, results, rejects, validated,"
                " chunked, results_ckpt, rejects_ckpt, " + ", ".join(JOB_COUNTERS) + ")"
                " VALUES (0, 'run', ?, ?, '', '', ?, ?, ?, ?" + ", ?" * len(JOB_COUNTERS) + ")"
                " ON CONFLICT DO NOTHING",
                (
                    ", ".join(names),
                    msgspec.json.encode(list(enumerate(names))).decode(),
                    int(self.meta("validated", "-1") or -1),
                    int(self.meta("chunked", "-1") or -1),
                    int(self.meta("results_ckpt", "0") or 0),
                    int(self.meta("rejects_ckpt", "0") or 0),
                    *counters,
                ),
            )
            self.set_meta("next_source", len(names))
            for key in ("validated", "chunked", "results_ckpt", "rejects_ckpt"):
                self.db.execute("DELETE FROM meta WHERE key=?", (key,))

    def forget_job(self, job: int) -> None:
        """Remove a job that a submit recorded and then could not start (its outputs could not
        be opened): nothing of it was read, and a later start must not resume it."""
        with self.transaction():
            cur = self.db.execute(
                "DELETE FROM jobs WHERE job=? AND state='open' AND validated < 0", (job,)
            )
            if cur.rowcount:
                self.db.execute("DELETE FROM meta WHERE key=?", (f"{_PRINTS}{job}",))

    def fail_job(self, job: int, failure: str) -> None:
        """Record why an open job failed (it still completes once its rows in flight have
        their outcome; a restart finds it failed)."""
        with self.transaction():
            self.db.execute(
                "UPDATE jobs SET failure=? WHERE job=? AND state='open'", (failure, job)
            )

    def job_complete(
        self,
        job: int,
        when: str,
        *,
        forget_rows: bool = False,
        forget_reuse: bool = False,
        failure: str | None = None,
        rows_read: int = 0,
    ) -> int:
        """Mark the job complete; returns (and records) how many tasks held its rows.

        ``forget_rows`` (a long-lived engine, whose ids are ``JOB/ID``): the job's ids and
        single-mode rows are deleted in the same transaction, so the state of a daemon that
        runs for weeks grows with the rows in flight, not with every row it ever took.
        ``forget_reuse`` (with ``forget_rows``; ``--reuse`` is on): so do its rows still in
        ``reuse_pending`` (those that ended as rejects: a daemon's state never starts a new
        run that would empty the table) and its ``reuse_from`` mark."""
        db = self.db
        with self.transaction():
            if forget_rows:
                self._forget_ids(job)
                if forget_reuse:
                    db.execute(
                        "DELETE FROM reuse_pending WHERE id >= ? AND id < ?",
                        (f"{job}/", f"{job}0"),
                    )
                    db.execute("DELETE FROM meta WHERE key=?", (f"reuse_from.{job}",))
                row = db.execute("SELECT sources FROM jobs WHERE job=?", (job,)).fetchone()
                for src, _ in _sources_decoder.decode(row[0]) if row else ():
                    db.execute(
                        "DELETE FROM singles WHERE pos >= ? AND pos < ?",
                        (src << POS_SHIFT, (src + 1) << POS_SHIFT),
                    )
            (tasks,) = db.execute("SELECT count(*) FROM job_tasks WHERE job=?", (job,)).fetchone()
            db.execute(
                "UPDATE jobs SET state='complete', completed_at=?, tasks=?, failure=?, rows_read=?"
                " WHERE job=?",
                (when, tasks, failure, rows_read, job),
            )
            db.execute("DELETE FROM job_tasks WHERE job=?", (job,))
        return int(tasks)
