"""``run_pipeline``: one run of the engine on one job (the manifests of ``fashiontag run``).

The run checks the state file's identity first (manifest fingerprints: resume, nothing to do,
a new run, or refuse), opens the manifests before anything is recorded, then runs an
:class:`~.engine.Engine` with one job and closes it at once: the engine ends when every row has
its outcome (or on a signal). The end-of-run reconciliation decides ``complete``. The CLI and
the benchmark harness both call :func:`run_pipeline`; the daemon drives the engine itself.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .. import _exceptions as exc
from .._client import ClientStats, TaggerClient
from .._config import ClientConfig
from .._postgres import is_postgres_url
from .._urls import clean_base_url
from .config import EngineConfig, RunSummary
from .ending import finish
from .engine import Engine, RunControl
from .flow import FatalRunError
from .gcpolicy import tune_gc
from .jobs import Job, JobSpec
from .manifest_bytes import ReadEnd
from .manifests import STDIN, check_readable_twice, manifest_names
from .outcome import already_complete
from .reuse.setup import open_reuse
from .run_checks import (
    ASKED,
    PATHS_BASE,
    absolute_outputs,
    asked_text,
    check_asked,
    check_sink,
    not_a_file,
    not_state_file,
    not_utf8,
    outputs_elsewhere,
    outputs_free,
    outputs_without_state,
    paths_base,
    rewritten_since,
    same_file,
)
from .service_check import (
    NEW_STATE,
    RESTART,
    check_service,
    record_service,
    service_text,
)
from .source import ManifestReader, open_manifests
from .state import Reconciliation, StateStore, open_state

if TYPE_CHECKING:
    from .reuse import ReuseHook  # (only a run with --reuse loads it)

__all__ = ["RunControl", "default_state_path", "run_pipeline"]

logger = logging.getLogger("fashiontag_pipeline.engine")


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
    """Tag every image of ``manifests`` (paths, or one path) into ``out`` (results) and
    ``rejects``; exactly once.

    ``state``: a SQLite file, a ``postgresql://`` URL (:mod:`.state.pgstore`) or a state
    already open (the daemon's fenced PostgreSQL state; closed here). Re-running with the same
    ``state`` resumes an interrupted run of the same manifests
    (content fingerprints; stdin only with ``resume_stdin``); after a completed run it does
    nothing for the same manifests and starts a new run for others; ``restart`` discards
    whatever the state holds. Returns the summary, ``complete`` only when the state store shows
    every row taken in with an outcome; raises :class:`ConfigError` (before anything is made)
    for an output that is a manifest, the state or the other output, :class:`ManifestError`
    (before any request) for an unreadable manifest, :class:`StateConflictError` (touching
    nothing) for an unfinished state of other manifests, and :class:`FatalRunError` when the
    run cannot go on (state saved).
    """
    started = time.monotonic()
    out, rejects = absolute_outputs(client, engine, state, out, rejects)  # (or a TypeError)
    readers: list[ManifestReader] = []

    def close_readers() -> None:
        for reader in readers:
            reader.close()

    try:
        names, state_path, readers = await _open_inputs(manifests, out, rejects, state, engine)
        # The fingerprints of the files the readers have open: hashing the paths first, an
        # exporter's rename landing meanwhile made the run read one dump under another's
        # fingerprint (resumed by line numbers, or tagged again by the same command).
        stop = None if control is None else control.stopping.is_set  # (Ctrl-C meanwhile)
        prints = [await anyio.to_thread.run_sync(r.fingerprint, stop) for r in readers]
        db = state_path if isinstance(state_path, StateStore) else open_state(state_path)
    except BaseException:
        close_readers()
        if isinstance(state, StateStore):  # (handed over open: closed here on every end)
            await finish(anyio.to_thread.run_sync, state.close)
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
        if run.opened == "new" and not restart and not isinstance(state_path, StateStore):
            run.note = outputs_without_state(db.location, out, rejects)
            if run.note:  # said before the sinks cut them to nothing
                logger.warning("%s", run.note)
        recorded = db.find_job(RUN_JOB) if run.opened in ("complete", "resumed") else None
        moved, elsewhere = outputs_elsewhere(recorded, out, rejects)
        if run.opened == "complete":
            moved = moved or rewritten_since(db, recorded, out, rejects)  # (still its own?)
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
        asked = asked_text(client.language, engine.default_detection)
        if run.resumed:
            check_asked(where, db.meta(ASKED), asked)
            if not isinstance(state_path, StateStore):  # (the daemon fails the manifest)
                check_sink(where, recorded, engine.sink, out)
        own_state = not isinstance(state_path, StateStore)  # (the daemon's always resumes)
        service = service_text(clean_base_url(client.base_url))
        confirmed = True  # (the service given and its key are the run's: recorded)
        if run.resumed:  # (one request, only when the base URL or the key changed)
            start_over = RESTART if own_state else NEW_STATE
            confirmed = await check_service(where, db, client, service, start_over)
        # The job's outputs are the ones given now (a resume may name other paths, once
        # the files are there).
        db.open_job(RUN_JOB, ", ".join(names), names, str(out), str(rejects), engine.sink)
        with db.transaction():  # the state's side of --reuse, in a (fenced) transaction
            db.set_meta(ASKED, asked)
            base = paths_base(db.meta(PATHS_BASE) if run.resumed else None)
            if base is not None:
                db.set_meta(PATHS_BASE, base)
            if confirmed:  # (a shared daemon's manifest too: its taker asks)
                record_service(db, client, service)
            reuse = open_reuse(  # --reuse: None without a store
                engine,
                language=client.language,
                db=db.db,
                resumed=run.resumed,
                state=where,
                one_run=True,
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
    # The caller's client may have served other runs: its counters before this one.
    since = dataclasses.replace(tagger.stats)
    summary = RunSummary(
        resumed=run.resumed,
        opened=run.opened,
        note=run.note,
        out=str(out),
        rejects=str(rejects),
        state=db.location,
    )
    core = Engine(client=tagger, db=db, state=run, config=engine, control=control, reuse=reuse)
    if base is not None:  # relative image paths: from where the run was begun
        core.validator.cwd = base
    spec = JobSpec(
        key=RUN_JOB,
        manifests=names,
        results=out,
        rejects=rejects,
        sink=engine.sink,
        prints=prints,  # the run's own check covers them (open_run)
    )
    restore_gc = tune_gc()
    changed: list[str] = []
    ends = [reader.read_end for reader in readers]  # (the engine drops its readers)
    stopped = False  # (an error ended it: never complete, though every row had its outcome)
    try:
        try:
            async with core:
                job = await core.submit(spec, readers)
                if watch is not None:
                    watch(job)  # the daemon's live counters of this manifest
                core.close()
                if progress:
                    from .progress import show_progress

                    snapshot = functools.partial(_snapshot, core, since)
                    async with show_progress(snapshot, interval=engine.progress_seconds):
                        await core.wait()
                else:
                    await core.wait()
            if core.complete and not core.interrupted and not isinstance(state, StateStore):
                # (The daemons look at theirs as they conclude: daemon/claims.py.)
                changed = await anyio.to_thread.run_sync(_changed_since_read, ends)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
    except Exception as err:
        stopped = True
        if isinstance(err, exc.ManifestError):
            err.mid_run = True  # past the rows taken in: the state holds a run of this very file
        # The run's counts go with the error (filled below): the CLI's --summary of a run that
        # stopped (exit 1) holds what it did, as on every other exit.
        setattr(err, _SUMMARY, summary)
        raise
    finally:
        restore_gc()
        close_readers()
        # Finished whatever cancels the caller (a timeout, a daemon's drain, a host's
        # shutdown): the run still flushes and closes its sinks, state and store.
        await finish(_close_run, tagger if own_client else None, core, reuse)
        summary.elapsed_s = round(time.monotonic() - started, 3)
        _fill(core, since, core.reconciliation, summary)
        summary.complete = summary.complete and not stopped
    if changed:
        # Every row read has its outcome (the state says complete, and holds the manifests as
        # read: the same command again is a new run of them as they are by then), but the
        # file changed (each says how: rows appended have none; a file cut or replaced is not
        # the one tagged): never reported complete.
        summary.complete = False
        summary.error = (
            f"{'; '.join(changed)}. Once"
            " the file is whole, run the same command again: it starts a new run of the"
            " manifests as they are then (every row is tagged again, unless --reuse STORE"
            " answers the unchanged ones from a result store)"
        )
        logger.error("run incomplete: %s", summary.error)
    return summary


async def _open_inputs(
    manifests: Sequence[str | Path],
    out: Path,
    rejects: Path,
    state: Path | str | StateStore | None,
    engine: EngineConfig,
) -> tuple[list[str], Path | str | StateStore, list[ManifestReader]]:
    """A run's checks before its state is opened (each refusal leaves nothing made), then its
    manifests opened: their names, the state to open, their readers."""
    names = manifest_names(manifests)  # (one path: not a sequence of one-letter names)
    if not names:
        raise exc.ManifestError("no manifest given")
    if names.count(STDIN) > 1:  # the second reader would find stdin read to its end
        raise exc.ManifestError("stdin (-) can be given as a manifest only once")
    state_path = state if state is not None else default_state_path(out)
    named: list[tuple[str, Path | str]] = [("results", out), ("rejects", rejects)]
    named += [("manifest", name) for name in names if name != STDIN]
    read: list[tuple[str, Path | str]] = [("manifest", STDIN)] if STDIN in names else []
    if isinstance(state_path, Path) or (isinstance(state_path, str) and "://" not in state_path):
        named.append(("state", state_path))
    problem = not_state_file(named) or not_utf8(named)
    problem = problem or not_a_file([("results", out), ("rejects", rejects)])
    # An output on a manifest or the state destroys it (the sinks cut it to 0 bytes).
    problem = problem or same_file(_own_files(out, rejects, named, engine.reuse) + read)
    if problem is not None:  # refused before anything is made
        raise exc.ConfigError(problem)
    # Another run writing an output refuses this one before its state is made, so that the
    # refusal leaves nothing behind (the sinks take the same lock when they open).
    await anyio.to_thread.run_sync(outputs_free, out, rejects)
    for name in names:
        check_readable_twice(name)  # (a FIFO is refused before it is opened)
    readers = await open_manifests(names, engine.read_batch_rows)
    return names, state_path, readers


async def _close_run(tagger: TaggerClient | None, core: Engine, reuse: ReuseHook | None) -> None:
    """A run's end: its own client's sessions, its state and outputs, its result store."""
    try:
        if tagger is not None:
            await tagger.aclose()
    finally:
        try:
            await anyio.to_thread.run_sync(core.journal.close)
        finally:
            if reuse is not None:
                await anyio.to_thread.run_sync(reuse.close_store)


def _own_files(
    out: Path, rejects: Path, named: list[tuple[str, Path | str]], reuse: str | None
) -> list[tuple[str, Path | str]]:
    """The run's files by the names of :func:`run_pipeline`'s parameters, for
    :func:`~.run_checks.same_file` (``named``: the outputs, the manifests read from files and
    a state file's path)."""
    files: list[tuple[str, Path | str]] = [("out", out), ("rejects", rejects)]
    files += [(what, path) for what, path in named[2:] if what == "state"]
    if reuse is not None and not is_postgres_url(reuse):
        files.append(("reuse", reuse))
    files += [(what, path) for what, path in named[2:] if what == "manifest"]
    return files


def _changed_since_read(ends: Sequence[ReadEnd]) -> list[str]:
    """How each manifest changed after it was read to its end (:class:`ReadEnd`); blocking,
    once per run."""
    return [c for end in ends if (c := end.changed()) is not None]


def _snapshot(core: Engine, since: ClientStats) -> dict[str, int]:
    c = core.journal.counters
    stats = core.client.stats
    return {
        "rows_read": core.rows_read,
        "submitted": c.get("submitted", 0),
        "tagged": c.get("tagged", 0) + c.get("failed", 0) + c.get("reused", 0),
        "rejected": c.get("rejected", 0),
        "pages": c.get("pages", 0),
        "single": c.get("single", 0),
        "tasks_live": core.tasks_live(),
        "retries": stats.retries - since.retries + core.budget.retries,
        "rate_limited": stats.rate_limited - since.rate_limited,
        "bytes_read": core.bytes_read(),
        "bytes_total": core.bytes_total(),
    }


def _fill(
    core: Engine, since: ClientStats, reconciliation: Reconciliation | None, summary: RunSummary
) -> None:
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
    summary.retries = stats.retries - since.retries + core.budget.retries
    summary.rate_limited = stats.rate_limited - since.rate_limited
    summary.ambiguous_writes = stats.ambiguous_writes - since.ambiguous_writes
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


#: The attribute of an error that stopped a run after its engine started: its summary.
_SUMMARY = "run_summary"


def summary_of(err: BaseException) -> RunSummary | None:
    """The summary of the run ``err`` stopped (counts, ``complete`` false), or None when it
    stopped before its engine started (nothing done yet)."""
    summary = getattr(err, _SUMMARY, None)
    return summary if isinstance(summary, RunSummary) else None


def summary_json(summary: RunSummary) -> bytes:
    return msgspec.json.format(msgspec.json.encode(summary), indent=2) + b"\n"


__all__ += ["FatalRunError", "summary_json", "summary_of"]
