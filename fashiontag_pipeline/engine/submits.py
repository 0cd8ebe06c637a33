"""Submits: how a job enters a running engine (:meth:`Engine.submit`), and what it must not do.

A submit opens the job's manifests, checks it against the state and the jobs in flight,
records it (or finds it, to resume), opens its outputs and hands its readers to the source.
One that cannot be honoured is refused, and records nothing:

* a key in flight in this engine (submitted, not complete): its manifests would be read twice;
* a second job of an engine that sends ids as they are (``namespaced=False``): two jobs'
  results could not be told apart;
* a key whose job was begun or completed on other manifest content: rows resume by their
  positions, so other content would be skipped up to the job's watermarks;
* a job the state holds open (opened with the engine, at its outputs) named with other
  outputs: the state would count its lines in files it does not write; so too a complete
  job named with other outputs while its own are still where it wrote them;
* a job whose outputs cannot be opened, or are locked by another job: a job recorded just now
  is forgotten again, so no later start resumes it;
* a job whose results or rejects path is one of its manifests, the state file or its other
  output (:class:`~fashiontag_pipeline.ConfigError`): its sink would cut that file to 0 bytes;
  so too one whose output is a manifest of another job in flight, or whose manifest is the
  output of one (its lines would be read as rows while they are written);
* a job of stdin (``-``) while another job reads it: it would take that job's rows.

A refused submit of stdin may have read its first bytes (to learn its format): its reader
gives them back as it is closed, and the next reader of stdin reads them first (a retry reads
the stream from its start; see :meth:`~.manifest_bytes.ManifestBytes.close`).

A submit under way when the engine is closed still has its job read: the source waits for it
(:attr:`JobSource.adding`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec

from .. import _exceptions as exc
from .config import EngineConfig
from .jobs import Job, Jobs, JobSpec
from .manifests import STDIN, ManifestPrint, describe, same_manifests
from .outcome import completed_job
from .run_checks import same_file
from .scheduler import JobSource
from .source import ManifestReader, open_manifests
from .state import Journal
from .state.store import JobRow

__all__ = ["NOT_STARTED", "RUNS_ONCE", "Submits"]

#: A file as a check names it: (what it is to the job, its path).
Named = tuple[str, Path | str]

#: An engine made but not entered: nothing reads or sends, so a job would wait for ever.
NOT_STARTED = "the engine is not started: use it inside `async with Engine(...) as engine:`"

#: An engine entered again after its ``async with`` block: it closed its state as it ended.
RUNS_ONCE = (
    "this Engine has run (its `async with` block ended, its state closed): an Engine runs"
    " once; make a new Engine, on the state opened again (StateDB(path)), for the next jobs"
)


class Submits:
    """The submits of one engine: ``register`` opens a job's outputs and watches it."""

    def __init__(
        self,
        *,
        journal: Journal,
        jobs: Jobs,
        source: JobSource,
        config: EngineConfig,
        register: Callable[[JobRow], Awaitable[Job]],
    ) -> None:
        self.journal = journal
        self.jobs = jobs
        self.source = source
        self.config = config
        self.register = register
        #: Keys of the submits under way.
        self.under_way: set[str] = set()
        #: The engine's stages run (its ``async with`` block was entered).
        self.running = False
        #: The key of the submit under way that reads stdin, if any.
        self.stdin_under_way: str | None = None

    async def submit(self, spec: JobSpec, readers: list[ManifestReader] | None) -> Job:
        if self.source.closing:
            raise RuntimeError("the engine is closed")
        if not self.running:
            raise RuntimeError(NOT_STARTED)
        self._check_key(spec.key)
        stdin = STDIN in spec.manifests
        if stdin:
            self._check_stdin(spec.key)
            self.stdin_under_way = spec.key
        self.under_way.add(spec.key)
        self.source.adding += 1
        try:
            return await self._submit(spec, readers)
        finally:
            self.under_way.discard(spec.key)
            if stdin:
                self.stdin_under_way = None
            self.source.add_done()

    def _check_stdin(self, key: str) -> None:
        """One job reads stdin at a time: another one's submit would read the start of what is
        left of the stream (to learn its format) and take those rows from the first."""
        reading = self.stdin_under_way
        for job in self.jobs.by_id.values():
            if job.submitted and any(name == STDIN for _, name in job.row.sources):
                reading = reading or job.row.key
        if reading is not None and reading != key:
            raise exc.StateConflictError(
                f"stdin (-) is read by job {reading!r} (in flight): one job at a time reads"
                " stdin, and a second would take rows from it; wait for its outcome, or give"
                " this job's rows as a file"
            )

    def _check_key(self, key: str) -> None:
        in_flight = self.jobs.of_key(key)
        if key in self.under_way or (in_flight is not None and in_flight.submitted):
            raise exc.StateConflictError(
                f"job {key!r} is already in flight in this engine: wait for its outcome"
                " (Engine.outcome) rather than submit it again, which would read its manifests"
                " twice"
            )
        if not self.jobs.ids.namespaced:
            others = {job.row.key for job in self.jobs.by_id.values()} | self.under_way
            others.discard(key)
            if others:
                raise exc.StateConflictError(
                    f"job {sorted(others)[0]!r} is in flight, and this engine sends ids as they"
                    " are (namespaced=False), so it cannot tell two jobs' results apart: wait"
                    " for its outcome, or make the Engine with namespaced=True to run several"
                    " jobs at once"
                )

    async def _submit(self, spec: JobSpec, readers: list[ManifestReader] | None) -> Job:
        others = self._files_in_flight(spec.key)  # (on the loop: the thread only stats)
        clash = await anyio.to_thread.run_sync(self._same_file, spec, others)
        if clash is not None:
            if readers is not None:
                for reader in readers:
                    reader.close()
            raise exc.ConfigError(f"job {spec.key!r}: {clash}")
        if readers is None:
            readers = await open_manifests(spec.manifests, self.config.read_batch_rows)
        try:
            db = self.journal.db
            prints = list(spec.prints) if spec.prints is not None else None
            if prints is None:
                # The files the readers have open (a path may name another by now).
                prints = [await anyio.to_thread.run_sync(r.fingerprint) for r in readers]
            found = await self.journal.run(db.find_job, spec.key)
            if found is not None:  # checked before open_job records anything of this submit
                self._check_content(found, await self.journal.run(db.job_prints, found.job), prints)
                self._check_outputs(found, spec)
                if found.state != "open":  # (before its outputs are recorded as the given)
                    await anyio.to_thread.run_sync(self._check_completed, found, spec)
            row = await self.journal.run(
                db.open_job,
                spec.key,
                spec.name or ", ".join(spec.manifests),
                list(spec.manifests),
                str(spec.results),
                str(spec.rejects),
                spec.sink,
                msgspec.json.encode(prints).decode(),
            )
            job = self.jobs.by_id.get(row.job)
            if row.state != "open":
                # Complete already (a crash after it completed, before its caller recorded
                # that): nothing to read or send; its counters are in the state.
                for reader in readers:
                    reader.close()
                return await completed_job(row, keep_lost=self.journal.keep_lost)
            if job is None:
                try:
                    job = await self.register(row)
                except BaseException:
                    if not row.resumed:
                        # Recorded just now and never started: a later start must not
                        # resume it (and cut back outputs it never wrote).
                        with anyio.CancelScope(shield=True):
                            await self.journal.run(db.forget_job, row.job)
                    raise
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        for reader, (src, recorded) in zip(readers, job.row.sources, strict=True):
            reader.source = src
            if STDIN not in (reader.name, recorded):
                # Every reject of the job names its manifest alike (a resume's first reject,
                # uncommitted, is then its own: see outcome.not_ours).
                reader.label = recorded
        job.submitted = True
        self.source.add(job, readers)
        return job

    def _files_in_flight(self, key: str) -> list[tuple[list[Named], list[Named]]]:
        """The (manifests, outputs) of each other job in flight."""
        out = []
        for job in self.jobs.by_id.values():
            if job.row.key == key:
                continue
            whose = f"of job {job.row.key!r} (in flight)"
            manifests: list[Named] = [(f"a manifest {whose}", name) for _, name in job.row.sources]
            outputs: list[Named] = [
                (f"the results {whose}", job.results.path),
                (f"the rejects {whose}", job.rejects.path),
            ]
            out.append((manifests, outputs))
        return out

    def _same_file(
        self, spec: JobSpec, others: list[tuple[list[Named], list[Named]]]
    ) -> str | None:
        """An output that is one of the job's manifests or the state file (a SQLite file):
        its sink would cut it to 0 bytes, or write lines into the database; or one that is a
        manifest of another job in flight (cut while that job reads it), or a manifest that
        is another job's output (its lines read as rows while written). Blocking."""
        outputs: list[Named] = [("results", spec.results), ("rejects", spec.rejects)]
        manifests: list[Named] = [("manifest", m) for m in spec.manifests if m != STDIN]
        files = list(outputs)
        location = self.journal.db.location
        if location and "://" not in location:
            files.append(("state", location))
        # The file stdin is, if any (``tag.py < products.csv``), this job's or one in flight's.
        stdin = STDIN in spec.manifests or any(
            m == STDIN for theirs, _ in others for _, m in theirs
        )
        read: list[Named] = [("manifest", STDIN)] if stdin else []
        clash = same_file(files + manifests + read)
        for theirs, written in others:
            theirs = [(what, m) for what, m in theirs if m != STDIN]  # (in ``read``)
            clash = clash or same_file(theirs + outputs) or same_file(written + manifests)
        return clash

    @staticmethod
    def _check_content(row: JobRow, recorded: str | None, prints: list[ManifestPrint]) -> None:
        """``recorded``: the fingerprints the job was made with (None: made without them, by
        ``run`` or an older version)."""
        if recorded is None:
            return
        before = msgspec.json.decode(recorded, type=list[ManifestPrint])
        if same_manifests(before, prints):
            return
        done = f"completed at {row.completed_at}" if row.state != "open" else "begun"
        raise exc.StateConflictError(
            f"job {row.key!r} was {done} on {describe(before)}; the same key now names"
            f" {describe(prints)}: a key resumes its job on the same content, so give new"
            " content a new key"
        )

    @staticmethod
    def _check_completed(row: JobRow, spec: JobSpec) -> None:
        """A complete job named with other outputs while its own are still where it wrote
        them: answered at the paths given, its outputs were recorded as those (empty files
        made there) and reported lost. Files moved there by the program are its. Blocking."""
        recorded = (os.path.abspath(row.results), os.path.abspath(row.rejects), row.sink)
        if recorded == (str(spec.results), str(spec.rejects), spec.sink):
            return
        if not any(os.path.lexists(path) for path in recorded[:2]):
            return  # (moved since: looked for at the paths given)
        kind = "" if row.sink == spec.sink else f" (sink {row.sink})"
        raise exc.StateConflictError(
            f"job {row.key!r} was completed at {row.completed_at}: its outcomes are in"
            f" {row.results} and {row.rejects}{kind}, not in the outputs given; read them"
            " there (submitted with those outputs, it is answered from the state) or move"
            " them to the outputs given first (nothing was recorded)"
        )

    def _check_outputs(self, row: JobRow, spec: JobSpec) -> None:
        if row.job not in self.jobs.by_id:
            return
        # (A job recorded by an older version may hold relative paths: named by the spec's.)
        recorded = (os.path.abspath(row.results), os.path.abspath(row.rejects), row.sink)
        if recorded != (str(spec.results), str(spec.rejects), spec.sink):
            raise exc.StateConflictError(
                f"job {row.key!r} is open in this engine and writes to {row.results} and"
                f" {row.rejects}: submit it with those outputs (move its files once it is"
                " complete)"
            )
