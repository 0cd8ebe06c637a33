"""A job's outputs opened (cut back to the state's checkpoints) before anything is written to
them, and closed when the job is complete; what a run or a job found complete hands back."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Collection
from pathlib import Path

import anyio

from .. import _exceptions as exc
from .config import RunSummary
from .jobs import IdSpace, Job, lost_outputs
from .rules import unkeyable
from .sinks import (
    RejectSink,
    ResultSink,
    committed_last_id,
    open_result_sink,
    uncommitted_first_line,
)
from .sqlite_sink import committed_row_id
from .state import JobRow, Journal, RunState, StateStore

__all__ = ["already_complete", "completed_job", "finalize_job", "open_job", "open_sinks"]

logger = logging.getLogger("fashiontag_pipeline.engine")


def not_ours(db: StateStore, row: JobRow, ids: IdSpace) -> list[Path]:
    """The job's JSONL outputs whose committed part cannot be its own lines (in the state
    thread): no line ends at the checkpoint, or the line that does is of an id the run never
    took in. Another run given the same path with its own state rewrote the file since; cut
    at the checkpoint, it would be split mid-line and appended to.

    At a checkpoint of 0 (killed before the state counted a byte of the file, rows taken in)
    the first line decides, uncommitted: a results line is of an id the run took in
    (committed before its task was made), or of one it did not if answered from the result
    store (``"reused": true``: written before its id is), a rejects line names one of the
    job's manifests (its id is committed with the write it follows). Cut to nothing, another
    run's file was lost. With no row taken in, the outputs are rewritten, as a new run's are.
    A SQLite results file (``--sink sqlite``): its row at the checkpoint, or its first at 0.
    A results line (row) of a task must be of a task the state records: another run of the
    same ids (a smaller dump of the catalogue) writes lines of those ids too."""
    foreign: list[Path] = []
    files = (
        (row.results, row.results_ckpt, row.sink != "sqlite", False),
        (row.rejects, row.rejects_ckpt, True, True),
    )
    manifests = {name for _, name in row.sources}
    for path, checkpoint, jsonl, rejects in files:
        if checkpoint <= 0 and row.validated < 0:
            continue  # (nothing committed, not a row: a new run, which rewrites the outputs)
        ident: str | None = None
        task: str | None = None
        reused = False
        if not jsonl:  # --sink sqlite: the row at the checkpoint (the first at 0)
            fits, ident, task, reused = committed_row_id(Path(path), checkpoint)
        else:
            fits, line = (
                committed_last_id(Path(path), checkpoint)
                if checkpoint > 0
                else uncommitted_first_line(Path(path))
            )
            if line is not None:
                ident, reused = line.id, line.reused
                task = None if reused else line.task_id
                if rejects and checkpoint <= 0:
                    fits, ident = line.source in manifests, None
        if fits and ident is not None and not unkeyable(ident):
            # (An id holding a NUL, or too long, is a client reject the dedupe never takes in:
            # no store holds one, so such a line is not looked up.) A line answered from the result
            # store is written before the commit that takes its id in: uncommitted (at 0), a
            # line of this run's is of an id not taken in yet, and one of an id taken in is
            # another run's (this run's row of it was sent, or its line committed).
            taken = bool(db.first_positions([ids.sent(row.job, ident)]))
            fits = taken != (reused and checkpoint <= 0)
        if fits and task is not None and not rejects:
            # Another run of the same ids (a smaller dump of the catalogue) writes lines of
            # them too, alike to the byte when the service answers alike: only this run's
            # tasks are its own.
            fits = db.task_known(task)
        if not fits:
            foreign.append(Path(path))
    return foreign


def _not_ours(path: object, checkpoint: int, sink: str, target: object) -> str:
    """What a resume refused for another run's file at ``path`` says."""
    rows = sink == "sqlite" and not isinstance(target, RejectSink)
    if checkpoint <= 0:
        where = (
            f"{path} does not begin with a {'result' if rows else 'line'} of this run, which"
            " was stopped before the state counted any of it written: another run given the"
            " same path wrote it since (or it was edited)"
        )
    else:
        what = f"row {checkpoint:,}" if rows else f"the {checkpoint:,} bytes"
        where = (
            f"{path} does not end, at {what} the state counts written, with a"
            f" {'result' if rows else 'line'} of this run: it was rewritten since (another run"
            " given the same path, an edit) or lost its last bytes (the machine crashed), so"
            " this run's lines are not there"
        )
    return (
        f"{where}; the file is left as it is: give this run other outputs, or start over with"
        " --restart (run) to write them again"
    )


def open_sinks(
    out: Path,
    rejects: Path,
    sink: str,
    job: JobRow,
    *,
    keep_lost: bool = False,
    foreign: Collection[Path] = (),
    complete: bool = False,
) -> tuple[ResultSink, RejectSink, str | None]:
    """A job's outputs, cut back to the state's checkpoints (a resume); a ``complete`` job's
    only looked at (:func:`_looked_at`), never cut. Blocking.

    An output that lost committed lines (removed, replaced or cut short since the state
    counted them), or whose path is in ``foreign`` (:func:`not_ours`: another run's file now),
    raises :class:`StateError`, or with ``keep_lost`` (a long-lived engine, which fails the
    job rather than stop) is kept as it is and named in the third value, the job's failure
    (None when nothing was lost)."""
    try:
        result_sink = open_result_sink(out, sink)
        try:
            reject_sink = RejectSink(rejects)
        except BaseException:
            result_sink.close()
            raise
    except OSError as err:
        raise exc.StateError(f"cannot open the outputs: {err}") from None
    lost: list[str] = []
    try:
        c = job.counters
        results = c.get("tagged", 0) + c.get("failed", 0) + c.get("reused", 0) > 0
        cuts: tuple[tuple[ResultSink | RejectSink, int, bool], ...] = (
            (result_sink, job.results_ckpt, results),
            (reject_sink, job.rejects_ckpt, True),
        )
        for target, checkpoint, committed in cuts:
            try:
                if Path(target.path) in foreign:
                    raise exc.StateError(_not_ours(target.path, checkpoint, sink, target))
                if complete:
                    _looked_at(target, checkpoint, sink)
                else:
                    target.truncate(checkpoint, results_committed=committed)
            except exc.StateError:
                if not keep_lost:
                    raise
                if not complete:
                    target.salvage()
                lost.append(str(target.path))
    except BaseException:
        result_sink.close()
        reject_sink.close()
        raise
    return result_sink, reject_sink, lost_outputs(lost) if lost else None


def _looked_at(target: ResultSink | RejectSink, checkpoint: int, sink: str) -> None:
    """A complete job's output: its lines ended at ``checkpoint`` when it completed, so what
    follows is another job's or run's, written since at the same path (cut back, a job given
    the folder since lost its lines). Raises :class:`StateError` when the job's committed part
    is not there, the file left as it is. Blocking."""
    rows = sink == "sqlite" and not isinstance(target, RejectSink)
    if target.checkpoint() < checkpoint:
        raise exc.StateError(
            f"{target.path} holds less than the {checkpoint:,} {'rows' if rows else 'bytes'}"
            " the job had written when it completed: its lines are not there (the file was"
            " removed, replaced or cut since); the file is left as it is"
        )
    if not rows:
        fits, _ = committed_last_id(Path(target.path), checkpoint)
        if not fits:
            raise exc.StateError(_not_ours(target.path, checkpoint, sink, target))


async def open_job(journal: Journal, row: JobRow, ids: IdSpace) -> Job:
    """An open job of the state, its outputs opened and cut back to its checkpoints.

    Outputs that lost committed lines raise :class:`StateError` or, with the journal's
    ``keep_lost`` (a long-lived engine), fail the job, recorded in the state at once (a later
    start knows it too): its manifests are not read on, and its rows already sent still get
    their outcome."""
    await journal.run(journal.db.check_id_space, row, ids.namespaced)
    foreign = await journal.run(not_ours, journal.db, row, ids)
    results, rejects, lost = await anyio.to_thread.run_sync(
        functools.partial(
            open_sinks,
            Path(row.results),
            Path(row.rejects),
            row.sink,
            row,
            keep_lost=journal.keep_lost,
            foreign=foreign,
        )
    )
    job = Job(row, results, rejects)
    job.failure = row.failure
    if lost is not None and job.failure is None:
        job.failure = lost
        await journal.run(journal.db.fail_job, row.job, lost)
        logger.error("job %s failed: %s", row.name, lost)
    return job


def _closed_outputs(row: JobRow, keep_lost: bool) -> tuple[ResultSink, RejectSink, str | None]:
    opened = open_sinks(
        Path(row.results), Path(row.rejects), row.sink, row, keep_lost=keep_lost, complete=True
    )
    opened[0].close()
    opened[1].close()
    return opened


async def completed_job(row: JobRow, *, keep_lost: bool = False) -> Job:
    """A job the state records as complete, as a finished :class:`~.jobs.Job` whose outputs
    are closed (a crash after it completed, before its caller recorded that). The files are
    opened in a worker thread; the job (and its events) is made on the event loop.
    ``keep_lost``: see :func:`open_sinks` (outputs lost since make the job failed)."""
    results, rejects, lost = await anyio.to_thread.run_sync(_closed_outputs, row, keep_lost)
    job = Job(row, results, rejects)
    job.failure = row.failure or lost
    job.rows_read = row.rows_read
    job.read_all = True
    job.settled.set()
    job.finalized.set()
    return job


def finalize_job(journal: Journal, job: Job, stamp: str, forget_rows: bool) -> None:
    """Every row of ``job`` has its outcome: flush, fsync and close its outputs, then record it
    complete (``forget_rows``: its ids leave the dedupe table). In the state thread.

    An output removed or replaced at its path while the job wrote to it (a cleanup job) took
    lines with it: the job is not complete but failed (the journal's ``keep_lost``), or
    the run stops with a :class:`StateError` and is not recorded complete."""
    job.check_outputs(keep_lost=journal.keep_lost)
    journal.close_job_outputs(job)
    job.counters["tasks"] = journal.db.job_complete(
        job.id,
        stamp,
        forget_rows=forget_rows,
        forget_reuse=journal.reuse is not None,
        failure=job.failure,
        rows_read=job.rows_read,
    )


def already_complete(
    run: RunState, out: Path, rejects: Path, state: str, started: float
) -> RunSummary:
    """The summary of a run found complete in its state: nothing was done."""
    c = run.counters
    return RunSummary(
        submitted=c.get("submitted", 0),
        tagged=c.get("tagged", 0),
        failed=c.get("failed", 0),
        rejected=c.get("rejected", 0),
        reused=c.get("reused", 0),
        tasks=c.get("tasks", 0),
        pages=c.get("pages", 0),
        single=c.get("single", 0),
        lost_tasks=c.get("lost_tasks", 0),
        resent=c.get("resent", 0),
        complete=True,
        opened="complete",
        note=f"already complete (finished at {run.completed_at}): nothing to do",
        elapsed_s=round(time.monotonic() - started, 3),
        out=str(out),
        rejects=str(rejects),
        state=state,
    )
