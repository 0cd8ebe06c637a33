"""``fashiontag run`` (DESIGN 4.1): flags, configuration, signals, the summary, the exit code.

The command builds its configuration (file ``[engine]`` table, then flags), runs its own event
loop (uvloop when importable) and returns an exit code: 0 when every row has an outcome (or the
run was already complete), 1 on a fatal error (one line on stderr, state saved), 2 on bad
usage or a state file of an unfinished run of other manifests (nothing touched), 3 when the run
ended with rows still lacking an outcome, or a manifest that grew, was cut or was replaced
after it was read (run it again), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio

from .._exceptions import ConfigError, FashiontagError, ManifestError, StateConflictError
from .._http import FIRST_FAILURE
from .._postgres import foreign_advice, is_postgres_url, keyword_conninfo, redact_url
from ..engine.config import RunSummary
from ..engine.run import (
    RunControl,
    default_state_path,
    first_error,
    run_pipeline,
    summary_of,
)
from ..engine.run_checks import a_folder, not_a_file, not_utf8, same_file
from . import summary_file
from .common import (
    ABORT_GRACE,
    EXIT_ERROR,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_client_arguments,
    client_config_from_args,
    file_arg,
    leave_if_hung,
    nonempty,
    run_async,
)
from .engine_flags import add_engine_arguments, engine_config_from_args
from .startup import hold_to_exit, take
from .summary_file import format_summary, report_failure, summary_under_way, write_summary

__all__ = ["add_run_arguments", "format_summary", "run_command"]

T = TypeVar("T")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fashiontag run``."""
    parser.add_argument(
        "manifests",
        type=nonempty,
        nargs="+",
        metavar="MANIFEST",
        help="CSV with a header, JSONL, or a plain list of URLs (one per line), .gz too; "
        "- reads stdin",
    )
    add_client_arguments(parser)
    parser.add_argument(
        "--out",
        type=file_arg,
        metavar="FILE",
        default=Path("results.jsonl"),
        help="results file (default: results.jsonl in the current directory)",
    )
    parser.add_argument(
        "--rejects",
        type=file_arg,
        metavar="FILE",
        default=None,
        help="rejects JSONL file (default: OUT's name with .rejects.jsonl, next to OUT: "
        "results.rejects.jsonl)",
    )
    parser.add_argument(
        "--state",
        type=_state_location,
        metavar="FILE|URL",
        default=None,
        help="state file, or a PostgreSQL URL (postgresql://user@host/db, #name after it names "
        "the state there; default run); the same command with the same state resumes "
        "(default: OUT.state, next to OUT)",
    )
    once = parser.add_mutually_exclusive_group()  # (--restart discards what --resume resumes)
    once.add_argument(
        "--restart",
        action="store_true",
        help="discard what the state file holds (even an unfinished run of other manifests) "
        "and start over; the outputs are rewritten",
    )
    once.add_argument(
        "--resume",
        action="store_true",
        help="resume an unfinished run that read stdin (only if stdin carries the same rows "
        "again: stdin cannot be fingerprinted before it is read)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: on). On a terminal a live line (percent and ETA "
        "when the manifests' size is known); otherwise (cron, a log file) one line every "
        "--progress-interval seconds",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        metavar="S",
        help="seconds between progress lines when stderr is not a terminal (default 30)",
    )
    parser.add_argument(
        "--summary", type=file_arg, metavar="FILE", help="write the run summary as JSON here"
    )
    add_engine_arguments(parser)


class _StoppedWhileStarting(Exception):
    """A stop signal arrived before the run had its handlers: it never started."""


STORE_HUNG = (
    f"stopped now: the state store does not answer (waited {ABORT_GRACE:.0f} s after the"
    " second signal); what it committed is kept: the same command resumes once it answers"
)


async def _with_signals(
    control: RunControl,
    body: Callable[[], Awaitable[T]],
    on_hung: Callable[[], int] | None = None,
) -> T:
    """Run ``body``; first SIGINT/SIGTERM stops gracefully, the second aborts. ``on_hung``
    (reports and returns the exit code): the run still going :data:`ABORT_GRACE` seconds
    after the second signal, the process leaves at once, as a kill -9 would (the state is
    consistent at its last commit, and the outputs are cut back to it on resume)."""
    result: list[T] = []
    try:
        await _signal_group(control, body, result, on_hung)
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    return result[0]


async def _signal_group(
    control: RunControl,
    body: Callable[[], Awaitable[T]],
    result: list[T],
    on_hung: Callable[[], int] | None,
) -> None:
    try:
        await _signal_tasks(control, body, result, on_hung)
    finally:
        hold_to_exit()  # the receiver gave the default handlers back: the run is over


async def _signal_tasks(
    control: RunControl,
    body: Callable[[], Awaitable[T]],
    result: list[T],
    on_hung: Callable[[], int] | None,
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # Installed before the run reads or sends anything; one that came while the command
        # started (its imports, its checks) was held for this moment.
        if take(signal.SIGINT, signal.SIGTERM):
            raise _StoppedWhileStarting
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                async for _ in signals:
                    if control.stopping.is_set():
                        print("fashiontag: second signal, stopping now", file=sys.stderr)
                        control.abort()
                    else:
                        print(
                            "fashiontag: stopping intake, finishing in-flight writes "
                            "(signal again to stop now)",
                            file=sys.stderr,
                        )
                        control.stop()

            async def main() -> None:
                result.append(await body())
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            tg.start_soon(main)
            if on_hung is not None:
                tg.start_soon(leave_if_hung, control.aborting, on_hung)


class _KeepTryingHint(logging.Filter):
    """Adds to the client's first-failure warning how long the run keeps trying, so the
    operator's first line says what failed and what happens next."""

    def __init__(self, give_up_after: float) -> None:
        super().__init__()
        self.give_up_after = give_up_after

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, FIRST_FAILURE, False):
            record.msg = str(record.msg) + (
                f"; the run keeps trying for {self.give_up_after:.0f} s (--give-up-after), "
                "then stops with its state saved"
            )
        return True


def _same_file(
    out: Path,
    rejects: Path,
    state: Path | str,
    manifests: list[str],
    reuse: str | None = None,
    summary: Path | None = None,
) -> str | None:
    """Why two of the run's files are one file (None when they are not): two sinks writing
    one file through two handles overwrite each other's lines, and an output on a manifest,
    the state or the result store destroys it (``--summary`` too: it replaces its file whole
    at the end, after the run reported every row written)."""
    named = [("--out", out), ("--rejects", rejects)]
    if summary is not None:
        named.append(("--summary", summary))
    if isinstance(state, Path):
        named.append(("--state", state))
    if reuse is not None and not is_postgres_url(reuse):
        named.append(("--reuse", Path(reuse)))
    named += [("manifest", Path(m)) for m in manifests]  # (-: the file stdin is, if any)
    return same_file(named)


def _shown(path: Path) -> str:
    """A path as text a summary can hold (a name that is not UTF-8 shown as \\xe9)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _state_location(text: str) -> Path | str:
    """``--state``: a URL (``scheme://...``) stays text, anything else is a file path."""
    nonempty(text)
    url = re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/", text) or keyword_conninfo(text)
    return text if url else file_arg(text)


def run_command(args: argparse.Namespace) -> int:
    """``fashiontag run``: returns the exit code."""
    out: Path = args.out
    # (``--out .`` or ``/`` has no name to put the others beside: refused below as a folder.)
    rejects: Path = args.rejects or (
        out.with_name(out.stem + ".rejects.jsonl") if out.name else out
    )
    state: Path | str = args.state or (default_state_path(out) if out.name else out)
    failed = RunSummary(out=_shown(out.absolute()), rejects=_shown(rejects.absolute()))
    failed.state = _shown(state.absolute()) if isinstance(state, Path) else redact_url(state)
    reuse: str | None = None

    def refuse(problem: str) -> int:
        """Exit 2 before anything is made; the summary says so (a cron job reading it must
        not find the last night's), unless it is itself the path at fault."""
        print(f"fashiontag: {problem}", file=sys.stderr)
        summary = args.summary
        if (
            summary is not None
            and not_utf8([("--summary", summary)]) is None
            and a_folder([("--summary", summary)]) is None  # (nor a device: /dev/null)
        ):
            clash = _same_file(out, rejects, state, args.manifests, reuse, args.summary)
            if clash == _same_file(out, rejects, state, args.manifests, reuse):
                with contextlib.suppress(OSError):
                    args.summary.parent.mkdir(parents=True, exist_ok=True)
                failed.error = problem
                write_summary(args.summary, failed)
        return EXIT_USAGE

    try:
        engine = engine_config_from_args(args)
        client = client_config_from_args(args)
    except (ConfigError, ValueError) as err:
        return refuse(str(err))
    reuse = engine.reuse
    if isinstance(state, str) and not is_postgres_url(state):
        return refuse(
            f"--state {redact_url(state)}: not a state this fashiontag can use: "
            + foreign_advice(state)
        )
    named: list[tuple[str, Path | str]] = [("--out", out), ("--rejects", rejects)]
    named += [("manifest", m) for m in args.manifests if m != "-"]
    if isinstance(state, Path):
        named.append(("--state", state))
    if args.summary is not None:
        named.append(("--summary", args.summary))
    if reuse is not None and not is_postgres_url(reuse):
        named.append(("--reuse", reuse))
    files = [(what, p) for what, p in named if what in ("--state", "--summary", "--reuse")]
    problem = not_utf8(named) or not_a_file([("--out", out), ("--rejects", rejects)], state)
    problem = problem or a_folder([(what, Path(p)) for what, p in files])
    if str(out) == "-" or str(rejects) == "-":
        which = "--out" if str(out) == "-" else "--rejects"
        problem = (
            f"{which} -: outcomes go to a file (a run cuts it back to its last checkpoint to"
            " resume), not to stdout: give a file path and read it after the run"
        )
    problem = problem or _same_file(out, rejects, state, args.manifests, reuse, args.summary)
    if problem is not None:
        return refuse(problem)
    # On by default: a live line on a terminal, periodic lines in a log (progress.py decides).
    progress = args.progress if args.progress is not None else True
    control = RunControl()
    client_logger = logging.getLogger("fashiontag_pipeline.client")
    hint = _KeepTryingHint(engine.give_up_after)
    client_logger.addFilter(hint)

    async def body() -> RunSummary:
        return await run_pipeline(
            args.manifests,
            client=client,
            out=out,
            rejects=rejects,
            state=state,
            engine=engine,
            progress=progress,
            control=control,
            restart=args.restart,
            resume_stdin=args.resume,
        )

    if args.summary is not None:
        try:  # made before the run: a missing folder is no reason to lose a night's report
            args.summary.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(f"fashiontag: --summary {args.summary}: {err.strerror}", file=sys.stderr)
            return EXIT_USAGE
        if not summary_under_way(args.summary, failed):  # (before the outputs are touched)
            return EXIT_USAGE

    def hung() -> int:
        return report_failure(args, failed, STORE_HUNG, EXIT_INTERRUPTED)

    def run() -> RunSummary:
        try:
            return run_async(lambda: _with_signals(control, body, hung))
        finally:
            hold_to_exit()  # again: uvloop gives the signals their defaults as it closes

    try:
        code = _run_and_report(args, run, failed)
    finally:
        client_logger.removeFilter(hint)
    if code != EXIT_OK and "-" in args.manifests:
        # A run that stops before stdin ends leaves a worker thread blocked reading it, and
        # the interpreter would wait for that thread (for the producer to close the pipe) at
        # exit. Everything is flushed and closed by now: leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run_and_report(
    args: argparse.Namespace, run: Callable[[], RunSummary], failed: RunSummary
) -> int:
    """Run, print the summary and write ``--summary``: on a failure too (with the reason: the
    run's counts when it stopped after its engine started, else ``failed``), so that a cron
    job reading it never finds the last night's report."""
    try:
        summary = run()
    except (_StoppedWhileStarting, InterruptedError):  # (a manifest's fingerprint given up)
        reason = "interrupted while starting: nothing was read or sent (run it again to start)"
        return report_failure(args, failed, reason, EXIT_INTERRUPTED)
    except StateConflictError as err:
        return summary_file.report_conflict(args, failed, err)
    except ManifestError as err:
        # A file broken past its first rows (a truncated download): its repaired copy is
        # other content, which the state (a run of this one) would refuse with exit 2. Stdin
        # cut short is resumed by its whole stream piped again (--restart bills every row
        # read again).
        hint = ""
        if err.mid_run and err.stdin:
            hint = (
                "; the state keeps the rows read before it: pipe the whole stream again with"
                " --resume (the rows already taken in are not sent again)"
            )
        elif err.mid_run:
            hint = (
                "; the state keeps the rows read before it: once the file is whole, run again"
                " with --restart"
            )
        reason = f"{' '.join(str(err).split())}{hint}"
        return report_failure(args, summary_of(err) or failed, reason, EXIT_ERROR)
    except FashiontagError as err:
        reason = " ".join(str(err).split())
        return report_failure(args, summary_of(err) or failed, reason, EXIT_ERROR)
    except (OSError, sqlite3.Error, MemoryError) as err:  # a disk, file or memory failure
        reason = (  # (MemoryError: a limit such as ulimit -v; one line, not a traceback)
            f"{type(err).__name__}: {str(err) or 'out of memory'} (what was committed is kept: the"
            " same command resumes once this is fixed)"
        )
        return report_failure(args, summary_of(err) or failed, reason, EXIT_ERROR)
    if summary.opened == "complete":
        print(
            f"fashiontag: run {summary.note} (state {summary.state}; results in {summary.out}; "
            "--restart to run it again)",
            file=sys.stderr,
        )
    else:
        if summary.opened == "replaced":
            print(
                f"fashiontag: {summary.note} (state {summary.state}; {summary.out} and "
                f"{summary.rejects} are rewritten)",
                file=sys.stderr,
            )
        print(format_summary(summary), file=sys.stderr)
    if args.summary is not None and not write_summary(args.summary, summary):
        return EXIT_ERROR
    if summary.complete:
        return EXIT_OK
    if summary.interrupted:
        return EXIT_INTERRUPTED
    # (``error`` on a run that ended: a manifest that grew after it was read, rows unread.)
    incomplete = summary.unsettled or summary.in_flight or summary.error
    return EXIT_INCOMPLETE if incomplete else EXIT_ERROR
