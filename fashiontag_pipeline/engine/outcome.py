"""What a run hands back when it does not run (the summary of a run found complete), and a job's
outputs opened (cut back to the state's checkpoints) before anything is written to them."""

from __future__ import annotations

import time
from pathlib import Path

from .. import _exceptions as exc
from .config import RunSummary
from .sinks import RejectSink, ResultSink, open_result_sink
from .state import JobRow, RunState

__all__ = ["already_complete", "open_sinks"]


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
        result_sink.truncate(job.results_ckpt)
        reject_sink.truncate(job.rejects_ckpt)
    except BaseException:
        result_sink.close()
        reject_sink.close()
        raise
    return result_sink, reject_sink


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
