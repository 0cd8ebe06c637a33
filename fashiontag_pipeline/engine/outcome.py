"""A job's outputs opened (cut back to the state's checkpoints) before anything is written to
them, and closed when the job is complete; what a run or a job found complete hands back."""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from .. import _exceptions as exc
from .config import RunSummary
from .jobs import Job
from .sinks import RejectSink, ResultSink, open_result_sink
from .state import JobRow, Journal, RunState

__all__ = ["already_complete", "completed_job", "finalize_job", "open_sinks"]


def open_sinks(out: Path, rejects: Path, sink: str, job: JobRow) -> tuple[ResultSink, RejectSink]:
    """A job's outputs, cut back to the state's checkpoints (a resume). Blocking."""
    try:
        result_sink = open_result_sink(out, sink)
        try:
            reject_sink = RejectSink(rejects)
        except BaseException:
            result_sink.close()
            raise
    except OSError as err:
        raise exc.StateError(f"cannot open the outputs: {err}") from None
    try:
        c = job.counters
        results = c.get("tagged", 0) + c.get("failed", 0) + c.get("reused", 0) > 0
        result_sink.truncate(job.results_ckpt, results_committed=results)
        reject_sink.truncate(job.rejects_ckpt)
    except BaseException:
        result_sink.close()
        reject_sink.close()
        raise
    return result_sink, reject_sink


def _closed_outputs(row: JobRow) -> tuple[ResultSink, RejectSink]:
    results, rejects = open_sinks(Path(row.results), Path(row.rejects), row.sink, row)
    results.close()
    rejects.close()
    return results, rejects


async def completed_job(row: JobRow) -> Job:
    """A job the state records as complete, as a finished :class:`~.jobs.Job` whose outputs
    are closed (a crash after it completed, before its caller recorded that). The files are
    opened in a worker thread; the job (and its events) is made on the event loop."""
    job = Job(row, *await anyio.to_thread.run_sync(_closed_outputs, row))
    job.failure = row.failure
    job.rows_read = row.rows_read
    job.read_all = True
    job.settled.set()
    job.finalized.set()
    return job


def finalize_job(journal: Journal, job: Job, stamp: str, forget_rows: bool) -> None:
    """Every row of ``job`` has its outcome: flush, fsync and close its outputs, then record it
    complete (``forget_rows``: its ids leave the dedupe table). In the state thread."""
    journal.close_job_outputs(job)
    job.counters["tasks"] = journal.db.job_complete(
        job.id, stamp, forget_rows=forget_rows, failure=job.failure, rows_read=job.rows_read
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
