"""``run_pipeline``: one run of the engine on one job (the manifests of ``fashiontag run``).

The run checks the state file's identity first (manifest fingerprints: resume, nothing to do,
a new run, or refuse), opens the manifests before anything is recorded, then runs an
:class:`~.engine.Engine` with one job and closes it at once: the engine ends when every row has
its outcome (or on a signal). The end-of-run reconciliation decides ``complete``. The CLI and
the benchmark harness both call :func:`run_pipeline`; the daemon drives the engine itself.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig
from .config import EngineConfig, RunSummary
from .engine import Engine, RunControl
from .flow import FatalRunError
from .gcpolicy import tune_gc
from .jobs import Job, JobSpec
from .manifests import STDIN, check_readable_twice
from .outcome import already_complete
from .outfiles import lock_output
from .reuse import open_reuse
from .source import open_manifests
from .state import JobRow, Reconciliation, StateStore, open_state

__all__ = ["RunControl", "default_state_path", "run_pipeline"]

logger = logging.getLogger("fashiontag_pipeline.engine")


def _outputs_elsewhere(job: JobRow | None, out: Path, rejects: Path) -> tuple[str, bool]:
    """What of a run's committed output is not at the paths given now ("" when all of it is),
    and whether it is because other paths were given.

    A file given at another path than the one recorded holds the run's lines when it was moved
    or copied there: at least as long as the state's checkpoint, and, while the recorded file
    is still in place, ending its committed part with the same bytes (the shared daemon's
    takeover copies the committed prefix to its own JSONL files; a SQLite results file is
    taken at another path only once the recorded one is gone). Otherwise the given path is some
    other file, never cut back and appended to. At the recorded path, a file missing or
    shorter than the checkpoint lost lines. (Results in SQLite are only checked to hold
    rows.)"""
    if job is None:
        return "", False
    problems: list[str] = []
    elsewhere = False
    files = (
        ("results", out, job.results, job.results_ckpt, job.sink != "sqlite"),
        ("rejects", rejects, job.rejects, job.rejects_ckpt, True),
    )
    for what, given, written, ckpt, in_bytes in files:
        if not written or ckpt <= 0:
            continue  # nothing committed to it
        needed = ckpt if in_bytes else 1
        if os.path.realpath(given) != os.path.realpath(written):
            if _size(given) >= needed and (
                _size(Path(written)) < needed or (in_bytes and _same_tail(given, written, ckpt))
            ):
                continue  # moved or copied to the path given, lines and all
            elsewhere = True
            problems.append(f"its {what} were written to {written}, not {given}")
            continue
        size = _size(given)
        if size < needed:
            state = "is missing" if size < 0 else "holds fewer lines than were committed"
            problems.append(f"its {what} file {given} {state}")
    return "; ".join(problems), elsewhere


def _same_tail(given: Path, written: str, end: int, span: int = 4096) -> bool:
    """Whether two files hold the same bytes just before ``end`` (a copy of a committed
    prefix, checked on its last ``span`` bytes rather than read whole)."""
    start = max(0, end - span)
    try:
        with given.open("rb") as a, open(written, "rb") as b:
            a.seek(start)
            b.seek(start)
            return a.read(end - start) == b.read(end - start)
    except OSError:
        return False


#: The meta key of the question a run's rows are asked: its language and default detection.
_ASKED = "asked"


def _asked(language: str, detection: Sequence[str] | None) -> str:
    return msgspec.json.encode(
        {"language": language, "detection": sorted(detection) if detection else None}
    ).decode()


def _describe_asked(asked: str) -> str:
    options = msgspec.json.decode(asked, type=dict[str, Any])
    detection = options.get("detection")
    shown = ",".join(detection) if detection else "the service's default"
    return f"--language {options.get('language')} and --detection {shown}"


def _check_asked(where: str, before: str | None, asked: str) -> None:
    """A resumed run must ask its rows what the run was begun with: rows already sent were
    asked that (their results are read in its language), and a result store files results by
    the question (``--reuse``)."""
    if before is None or before == asked:
        return
    raise exc.StateConflictError(
        f"{where} holds an unfinished run begun with {_describe_asked(before)}; this command"
        f" gives {_describe_asked(asked)}: resume it with the options it was begun with, so"
        " that every row is answered alike, or pass --restart to start over (every row is"
        " tagged again)"
    )


def _outputs_free(*paths: Path) -> None:
    """StateConflictError when another process holds the lock of an existing output."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # not there (made by the sinks) or unreadable (they say so)
        try:
            lock_output(fd, path)
        finally:
            os.close(fd)


def _absolute(path: Path) -> Path:
    """``path`` made absolute against the working directory (a string operation, no I/O)."""
    return Path(os.path.abspath(path))


def not_utf8(named: Sequence[tuple[str, Path | str]]) -> str | None:
    """Why one of the run's paths cannot be used (None when each can): a name that is not
    UTF-8 (a Latin-1 name from a file share, here or in a folder above it, the working
    directory included) cannot be recorded in the state or a summary, which hold text."""
    for what, path in named:
        text = os.path.abspath(path)
        try:
            text.encode()
        except UnicodeEncodeError:
            shown = os.fsencode(text).decode("utf-8", "backslashreplace")
            return (
                f"{what} {shown}: its path is not UTF-8 (a name written in another encoding):"
                " rename the file or folder, or give another path"
            )
    return None


def not_a_file(named: Sequence[tuple[str, Path]]) -> str | None:
    """Why an output cannot be used (None when each can): one that exists and is not a
    regular file (``/dev/null``, ``/dev/stdout``, a pipe, a folder). A run cuts its outputs
    back to their last checkpoint to resume and fsyncs them, which only a file allows: on
    /dev/null the run tagged every row and then failed at its end, every night."""
    for what, path in named:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # not there yet (made by the sinks), or unreadable (they say so)
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a device, a pipe or a socket"
            return (
                f"{what} {path} is not a regular file ({kind}): a run writes its outcomes to a"
                " file, which it cuts back to its last checkpoint to resume; give a file path"
                " (and read or delete it after the run)"
            )
    return None


def _size(path: Path) -> int:
    """The size of a file in bytes, -1 when there is none."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


#: The key of ``run``'s one job in its state file.
RUN_JOB = "run"


def default_state_path(out: Path) -> Path:
    """The state file used when none is given: next to the output."""
    return out.with_name(out.name + ".state")


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
    state: Path | str | StateStore | None = None,
    engine: EngineConfig = EngineConfig(),  # noqa: B008 - frozen value object
    progress: bool = False,
    control: RunControl | None = None,
    restart: bool = False,
    resume_stdin: bool = False,
    watch: Callable[[Job], None] | None = None,
) -> RunSummary:
    """Tag every image of ``manifests`` into ``out`` (results) and ``rejects``; exactly once.

    ``state``: a SQLite file, a ``postgresql://`` URL (:mod:`.state.pgstore`) or a state
    already open (the daemon's fenced PostgreSQL state; closed here). Re-running with the same
    ``state`` resumes an interrupted run of the same manifests
    (content fingerprints; stdin only with ``resume_stdin``); after a completed run it does
    nothing for the same manifests and starts a new run for others; ``restart`` discards
    whatever the state holds. Returns the summary, ``complete`` only when the state store shows
    every row taken in with an outcome; raises :class:`ManifestError` (before any request) for
    an unreadable manifest, :class:`StateConflictError` (touching nothing) for an unfinished
    state of other manifests, and :class:`FatalRunError` when the run cannot go on (state
    saved).
    """
    started = time.monotonic()
    # Recorded absolute: a resume from another working directory names the same files.
    out, rejects = _absolute(out), _absolute(rejects)
    names = [str(m) for m in manifests]
    if not names:
        raise exc.ManifestError("no manifest given")
    if names.count(STDIN) > 1:  # the second reader would find stdin read to its end
        raise exc.ManifestError("stdin (-) can be given as a manifest only once")
    state_path = state if state is not None else default_state_path(out)
    named: list[tuple[str, Path | str]] = [("results", out), ("rejects", rejects)]
    named += [("manifest", name) for name in names if name != STDIN]
    if isinstance(state_path, Path) or (isinstance(state_path, str) and "://" not in state_path):
        named.append(("state", state_path))
    problem = not_utf8(named) or not_a_file([("results", out), ("rejects", rejects)])
    if problem is not None:  # refused before anything is made
        raise exc.ConfigError(problem)
    # Another run writing an output refuses this one before its state is made, so that the
    # refusal leaves nothing behind (the sinks take the same lock when they open).
    await anyio.to_thread.run_sync(_outputs_free, out, rejects)
    for name in names:
        check_readable_twice(name)  # (a FIFO is refused before it is opened)
    readers = await open_manifests(names, engine.read_batch_rows)

    def close_readers() -> None:
        for reader in readers:
            reader.close()

    try:
        # The fingerprints of the files the readers have open: hashing the paths first, an
        # exporter's rename landing meanwhile made the run read one dump under another's
        # fingerprint (resumed by line numbers, or tagged again by the same command).
        prints = [await anyio.to_thread.run_sync(reader.fingerprint) for reader in readers]
        db = state_path if isinstance(state_path, StateStore) else open_state(state_path)
    except BaseException:
        close_readers()
        raise
    where = db.where
    try:
        order = None if restart else db.recorded_order(prints)
        if order is not None:  # the run's manifests in another order: read in the run's
            readers = [readers[i] for i in order]
            names = [names[i] for i in order]
            prints = [prints[i] for i in order]
            logger.warning(
                "the manifests are the state's run's, given in another order: read in its"
                " order (%s)",
                ", ".join(names),
            )
        run = db.open_run(prints, restart=restart, resume_stdin=resume_stdin)
        recorded = db.find_job(RUN_JOB) if run.opened in ("complete", "resumed") else None
        moved, elsewhere = _outputs_elsewhere(recorded, out, rejects)
        if run.opened == "complete":
            db.close()
            close_readers()
            summary = already_complete(run, out, rejects, db.location, started)
            if moved:
                # Complete all the same (every row has its line, where it was written): tagging
                # again costs a request per row, so only --restart does it.
                summary.note += f"; but {moved}: pass --restart to tag them again"
            if elsewhere and recorded is not None:  # say where the results are
                summary.out, summary.rejects = recorded.results, recorded.rejects
            return summary
        if elsewhere:  # (lines lost at the same path: the sinks' truncate says so)
            raise exc.StateConflictError(
                f"{where} holds an unfinished run, but {moved}: give the paths it writes to"
                " (or move its files to the paths given) to resume it, or pass --restart to"
                " start over (every row is tagged again)"
            )
        asked = _asked(client.language, engine.default_detection)
        if run.resumed:
            _check_asked(where, db.meta(_ASKED), asked)
        # The job's outputs are the ones given now (a resume may name other paths, once
        # the files are there).
        db.open_job(RUN_JOB, ", ".join(names), names, str(out), str(rejects), engine.sink)
        with db.transaction():  # the state's side of --reuse, in a (fenced) transaction
            db.set_meta(_ASKED, asked)
            reuse = open_reuse(  # --reuse: None without a store
                engine,
                language=client.language,
                db=db.db,
                resumed=run.resumed,
                state=where,
            )
    except sqlite3.Error as err:
        db.close()
        close_readers()
        # The state's first writes (a full disk, a file this process may not write): named,
        # as :meth:`Journal.run` names those of the run ("attempt to write a readonly
        # database" alone does not say which file).
        if where in str(err):
            raise
        raise type(err)(f"{where}: {err}") from err
    except BaseException:
        db.close()
        close_readers()
        raise

    own_client = isinstance(client, ClientConfig)
    tagger = TaggerClient(config=client) if isinstance(client, ClientConfig) else client
    summary = RunSummary(
        resumed=run.resumed,
        opened=run.opened,
        note=run.note,
        out=str(out),
        rejects=str(rejects),
        state=db.location,
    )
    core = Engine(client=tagger, db=db, state=run, config=engine, control=control, reuse=reuse)
    spec = JobSpec(
        key=RUN_JOB,
        manifests=names,
        results=out,
        rejects=rejects,
        sink=engine.sink,
        prints=prints,  # the run's own check covers them (open_run)
    )
    restore_gc = tune_gc()
    try:
        try:
            async with core:
                job = await core.submit(spec, readers)
                if watch is not None:
                    watch(job)  # the daemon's live counters of this manifest
                core.close()
                if progress:
                    from .progress import show_progress

                    snapshot = functools.partial(_snapshot, core)
                    async with show_progress(snapshot, interval=engine.progress_seconds):
                        await core.wait()
                else:
                    await core.wait()
        except BaseExceptionGroup as group:
            raise first_error(group) from None
    except exc.ManifestError as err:
        err.mid_run = True  # past the rows taken in: the state holds a run of this very file
        raise
    finally:
        restore_gc()
        close_readers()
        # Shielded: a run cancelled from outside (a caller's timeout, a daemon's drain) still
        # flushes and closes its sinks and state.
        with anyio.CancelScope(shield=True):
            if own_client:
                await tagger.aclose()
            await anyio.to_thread.run_sync(core.journal.close)
            if reuse is not None:
                await anyio.to_thread.run_sync(reuse.close_store)
        summary.elapsed_s = round(time.monotonic() - started, 3)
        _fill(core, core.reconciliation, summary)
    return summary


def _snapshot(core: Engine) -> dict[str, int]:
    c = core.journal.counters
    return {
        "rows_read": core.rows_read,
        "submitted": c.get("submitted", 0),
        "tagged": c.get("tagged", 0) + c.get("failed", 0) + c.get("reused", 0),
        "rejected": c.get("rejected", 0),
        "pages": c.get("pages", 0),
        "single": c.get("single", 0),
        "tasks_live": core.tasks_live(),
        "retries": core.client.stats.retries + core.budget.retries,
        "rate_limited": core.client.stats.rate_limited,
        "bytes_read": core.bytes_read(),
        "bytes_total": core.bytes_total(),
    }


def _fill(core: Engine, reconciliation: Reconciliation | None, summary: RunSummary) -> None:
    c = core.journal.counters
    summary.rows_read = core.rows_read
    summary.submitted = c.get("submitted", 0)
    summary.tagged = c.get("tagged", 0)
    summary.failed = c.get("failed", 0)
    summary.rejected = c.get("rejected", 0)
    summary.reused = c.get("reused", 0)
    summary.tasks = c.get("tasks", 0)
    summary.pages = c.get("pages", 0)
    summary.single = c.get("single", 0)
    stats = core.client.stats
    summary.retries = stats.retries + core.budget.retries
    summary.rate_limited = stats.rate_limited
    summary.ambiguous_writes = stats.ambiguous_writes
    summary.expired_writes = core.writer.refused_writes
    summary.complete = core.complete and not core.interrupted
    summary.interrupted = core.interrupted and not core.complete
    summary.lost_tasks = c.get("lost_tasks", 0)
    summary.resent = c.get("resent", 0)
    if reconciliation is not None:
        summary.unsettled = reconciliation.unsettled
        summary.in_flight = list(reconciliation.in_flight)
    clock = core.client.server_clock
    if clock.known:
        summary.server_clock_offset_s = round(clock.correction, 1)
    if summary.elapsed_s > 0:
        summary.rows_per_s = round(core.rows_read / summary.elapsed_s, 1)


def summary_json(summary: RunSummary) -> bytes:
    return msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n"


__all__ += ["FatalRunError", "not_a_file", "not_utf8", "summary_json"]
