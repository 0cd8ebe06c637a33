"""What ``fashiontag run`` reports: the summary lines on stderr, and ``--summary FILE``.

``--summary`` is replaced whole at the end of every run, on a failure too, and on a refusal
before the run starts (bad usage or configuration, exit 2), so that a cron job never reads
last night's report as tonight's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from .._exceptions import StateConflictError, StateInUseError
from ..engine.config import RunSummary
from ..engine.run import summary_json
from ..engine.run_checks import outputs_free
from ..engine.state.sqlite import state_free
from .common import EXIT_INTERRUPTED, EXIT_USAGE, one_line

__all__ = [
    "format_summary",
    "report_conflict",
    "report_failure",
    "summary_of_refused_flags",
    "summary_under_way",
    "write_summary",
]


#: How the summary of a run at work begins its ``error``.
UNDER_WAY = "the run has not ended"


def format_summary(summary: RunSummary) -> str:
    status = (
        "complete"
        if summary.complete
        else "interrupted"
        if summary.interrupted
        else "incomplete"
        if summary.unsettled or summary.in_flight or summary.error
        else "stopped"
    )
    lines = [
        f"run {status} in {summary.elapsed_s:.1f}s ({summary.rows_per_s:,.0f} rows/s)",
        f"  rows read {summary.rows_read:,}   submitted {summary.submitted:,}   "
        f"tagged {summary.tagged:,}   failed {summary.failed:,}   rejected {summary.rejected:,}"
        + (f"   reused {summary.reused:,}" if summary.reused else "")
        + (f"   single mode {summary.single:,}" if summary.single else ""),
        f"  tasks {summary.tasks}   pages {summary.pages}   retries {summary.retries}   "
        f"rate limited {summary.rate_limited}   ambiguous writes {summary.ambiguous_writes}",
        f"  results {summary.out}   rejects {summary.rejects}   state {summary.state}",
    ]
    if summary.lost_tasks or summary.resent:
        lines.append(
            f"  tasks forgotten by the service {summary.lost_tasks}   rows sent again "
            f"{summary.resent:,}"
        )
    if summary.server_clock_offset_s:
        lines.append(f"  service clock offset {summary.server_clock_offset_s:+.1f}s")
    if not summary.complete and (summary.unsettled or summary.in_flight):
        what = "; ".join(summary.in_flight)
        if summary.unsettled < 0:
            lines.append(f"  the state cannot be trusted: {what}")
        else:
            lines.append(
                f"  {summary.unsettled:,} rows have no outcome yet"
                + (f" ({what})" if what else "")
                + ": run the same command again to finish them"
            )
    if summary.error:
        lines.append(f"  error: {summary.error}")
    return "\n".join(lines)


def report_failure(args: argparse.Namespace, summary: RunSummary, reason: str, code: int) -> int:
    # (one_line: a service's words quoted in ``reason`` reach no terminal's controls as sent)
    print(f"fashiontag: {one_line(reason)}", file=sys.stderr)
    if args.summary is not None:
        summary.error = reason
        if code == EXIT_INTERRUPTED:  # (while starting; a second signal's stop that hung)
            summary.interrupted = True
        write_summary(args.summary, summary)
    return code


def report_conflict(args: argparse.Namespace, failed: RunSummary, err: StateConflictError) -> int:
    """The run refused for its state (exit 2). Refused at a lock another run at work holds
    (two cron lines past :func:`summary_under_way`'s check at once, or a PostgreSQL state,
    whose lock only the run takes): ``--summary`` is that run's, and left to it; when this
    process's own "has not ended" replaced it, it says another run is at work (a refusal
    there would read as that run's failure, and say nothing once a kill ended it)."""
    reason = " ".join(str(err).split())
    if not isinstance(err, StateInUseError) or args.summary is None:
        return report_failure(args, failed, reason, EXIT_USAGE)
    print(f"fashiontag: {one_line(reason)}", file=sys.stderr)
    if _under_way_on(args.summary, (failed.out, failed.rejects, failed.state), os.getpid()):
        error = (
            f"{UNDER_WAY}: another run is at work on these files (process {os.getpid()},"
            f" started at the same time, was refused: {reason}); this is replaced when it"
            " ends; if no fashiontag is at work on them, it was killed (the same command"
            " resumes it)"
        )
        write_summary(args.summary, msgspec.structs.replace(failed, error=error))
    return EXIT_USAGE


def summary_of_refused_flags(arguments: Sequence[str], reason: str) -> None:
    """``run``'s command line refused by argparse (exit 2): the ``--summary`` it names, when it
    names one, is replaced by a summary that says so."""
    path: str | None = None
    for i, arg in enumerate(arguments):
        flag, equals, value = arg.partition("=")
        # argparse takes a unique prefix of a flag as the flag: ``--su`` and longer are
        # ``--summary`` (no other flag of run begins so; ``--s`` is ambiguous, refused)
        if len(flag) < 4 or not "--summary".startswith(flag):
            continue
        if equals:
            path = value
        elif i + 1 < len(arguments):
            path = arguments[i + 1]
    if not path or path.endswith(("/", os.sep)) or "://" in path:
        return  # (none, a folder's or a URL: refused as such, see file_arg)
    summary = RunSummary(error=" ".join(reason.split()))
    with contextlib.suppress(OSError):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_summary(Path(path), summary)


def summary_under_way(path: Path, failed: RunSummary) -> bool:
    """``--summary`` replaced, as the run starts, by one that says it has not ended: a loader
    told to read the results once the summary says ``complete`` must not find last night's
    while tonight's run rewrites them, nor after a kill (SIGKILL, the OOM killer) that left
    no summary of its own.

    False (refused, said on stderr) when another run is at work on these outputs or this state
    (the same cron line fired again): a summary naming them is that run's, and left to it."""
    try:
        outputs_free(Path(failed.out), Path(failed.rejects))
        if "://" not in failed.state:  # (PostgreSQL's lock is taken by the run)
            state_free(Path(failed.state))
    except StateConflictError as err:
        print(f"fashiontag: {err}", file=sys.stderr)
        if not _under_way_on(path, (failed.out, failed.rejects, failed.state)):
            write_summary(path, msgspec.structs.replace(failed, error=str(err)))
        return False
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    under_way = msgspec.structs.replace(
        failed,
        error=f"{UNDER_WAY} (started at {started}, process {os.getpid()}): this is"
        " replaced when it ends; if no fashiontag is at work on it, it was killed (the same"
        " command resumes it)",
    )
    return write_summary(path, under_way)


def _under_way_on(path: Path, files: Sequence[str], pid: int | None = None) -> bool:
    """Whether the summary at ``path`` is a run's "has not ended" on one of ``files`` (its
    results, rejects or state): the live run's, replaced by it when it ends. Any other (last
    night's ``complete``) is replaced by the refusal: those files are being rewritten.
    ``pid``: only the one process ``pid`` wrote as it started."""
    try:
        data = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return False
    return (
        isinstance(data, dict)
        and data.get("complete") is False
        and str(data.get("error")).startswith(UNDER_WAY)
        and any(data.get(k) in files for k in ("out", "rejects", "state"))
        and (pid is None or f"process {pid})" in str(data.get("error")))
    )


def write_summary(path: Path, summary: RunSummary) -> bool:
    """``--summary`` replaced whole (a reader never sees half of it, nor, after a power cut,
    an empty file under its name: the data is synced before the rename, the folder after
    it); False, said on stderr, when it cannot be written (no temp file left). A symlink is
    followed: the file it names (the one a loader watches) is replaced, the link kept."""
    try:
        real = Path(os.path.realpath(path))
    except OSError as err:  # (a relative path in a current directory removed)
        print(f"fashiontag: cannot write --summary {path}: {err.strerror or err}", file=sys.stderr)
        return False
    with contextlib.suppress(OSError):
        if not stat.S_ISREG(os.stat(real).st_mode):  # /dev/null: the device is not replaced
            print(f"fashiontag: cannot write --summary {path}: not a regular file", file=sys.stderr)
            return False
    # A temp name of its own (two runs ending at once with one --summary: one would truncate
    # the other's half-written file and rename it, and the other's rename find none).
    tmp = real.with_name(f".{real.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(summary_json(summary))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        print(f"fashiontag: cannot write --summary {path}: {err.strerror or err}", file=sys.stderr)
        return False
    with contextlib.suppress(OSError):  # (a folder some file systems cannot sync)
        folder = os.open(real.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return True
