"""Jobs: the manifests a long-lived engine takes over time, each with its own outputs.

A *job* is a set of manifests whose outcomes go to one pair of outputs: ``fashiontag run`` is
one job, the daemon makes one per manifest. Jobs share everything else (the client session,
the task rotation, the state store): rows of several jobs may share a chunk and a task. Every
row carries its job in its position (``source << 40 | line``, and each job owns its source
indexes), so every outcome (a results line, a reject) reaches its own job's outputs.

Ids are made distinct inside a task (:class:`IdSpace`): when several jobs may be in flight
(the daemon), the id sent to the service is ``JOB/ID``, and outputs carry ``ID`` again. A run of
one job sends its ids as they are.

A job is complete when its manifests are read to the end and its ``settled`` counter (outcomes
written) has reached its ``accepted`` counter (distinct ids taken in): :meth:`Jobs.check`
looks after every commit that touched it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import msgspec
from msgspec.structs import force_setattr

from .._exceptions import StateError
from .manifests import ManifestPrint, manifest_names
from .pages import PageRow
from .sinks import Reject, RejectSink, ResultSink
from .source import ManifestReader
from .state import POS_SHIFT
from .state.store import JobRow

__all__ = ["IdSpace", "Job", "JobEnd", "JobSpec", "Jobs", "lost_outputs"]

_LINE_MASK = (1 << POS_SHIFT) - 1


#: The kinds of results sink a job may have: ``SinkKind``'s (not imported from ``.config``,
#: which imports the result store, as the state package, importing this module, may not).
SINK_KINDS = ("jsonl", "sqlite")


class JobSpec(msgspec.Struct, frozen=True):
    """What a caller hands the engine: ``key`` names the job in the state (the same key
    again resumes it, on the same manifest content), ``manifests`` are read in order, outcomes
    go to ``results`` and ``rejects`` (``sink``: ``jsonl`` or ``sqlite`` results). One path
    given as ``manifests`` is that one manifest. ``results`` and ``rejects`` are made
    absolute against the working directory when the spec is made (recorded so, as
    ``run_pipeline`` records its own): a program whose working directory changes, or which
    starts again from another one, still writes and resumes the job's files.

    ``prints``: the manifests' fingerprints (size and SHA-256), when the caller has them
    already; else the engine takes them (reading each file once more). A key submitted again
    with other content is refused."""

    key: str
    manifests: Sequence[str]
    results: Path
    rejects: Path
    sink: str = "jsonl"
    name: str = ""
    prints: Sequence[ManifestPrint] | None = None

    def __post_init__(self) -> None:
        # One path is that one manifest (not one a character); each a str.
        force_setattr(self, "manifests", manifest_names(self.manifests))
        if self.sink not in SINK_KINDS:  # ("SQLite": JSONL written into the file meant for it)
            raise ValueError(f"sink must be one of {', '.join(SINK_KINDS)}, got {self.sink!r}")
        for name in ("results", "rejects"):
            force_setattr(self, name, Path(os.path.abspath(getattr(self, name))))


class JobEnd(msgspec.Struct, frozen=True):
    """The source read a job's manifests to the end (sent down the line after its last
    batch)."""

    job: int


class Job(msgspec.Struct, eq=False):
    """A job in flight: its state row, its outputs and its readers."""

    row: JobRow
    results: ResultSink
    rejects: RejectSink
    readers: list[ManifestReader] = msgspec.field(default_factory=list)
    #: Submitted in this engine's life (its manifests are being read): a job the state held
    #: open when the engine started is not, until its key is submitted again.
    submitted: bool = False
    #: Set once the source read every manifest of the job and intake committed the last row.
    read_all: bool = False
    #: Set when every row taken in has its outcome written (or the job failed).
    settled: anyio.Event = msgspec.field(default_factory=anyio.Event)
    #: Set once the engine recorded it complete and closed its outputs.
    finalized: anyio.Event = msgspec.field(default_factory=anyio.Event)
    #: Why the job's manifests could not be read to the end (None: they could).
    failure: str | None = None
    rows_read: int = 0
    #: The position of the last row read from its manifests (-1: none yet).
    read_to: int = -1
    #: Its outputs are closed (it completed): a late page (rows of it again, or not its own)
    #: writes nothing to it. Set and read in the state thread.
    closed: bool = False

    @property
    def id(self) -> int:
        return self.row.job

    @property
    def counters(self) -> dict[str, int]:
        return self.row.counters

    @property
    def sources(self) -> dict[int, str]:
        return dict(self.row.sources)

    def pending(self) -> int:
        """Rows taken in without an outcome yet."""
        c = self.row.counters
        return c["accepted"] - c["settled"]

    def check_outputs(self, *, keep_lost: bool) -> None:
        """An output removed, replaced or cut short at its path while the job writes to it (a
        cleanup job, a log rotation) took the lines written before with it: the job fails
        (``keep_lost``: a long-lived engine; its manifests are not read on), or
        :class:`StateError` stops the run, which is then not recorded complete. (An ``fstat``
        and a ``stat`` per output: called when the outputs are fsync-ed and when the job
        completes.)"""
        lost = [str(sink.path) for sink in (self.results, self.rejects) if sink.removed()]
        if not lost:
            return
        if not keep_lost:
            raise StateError(
                f"the run's outputs were removed, renamed, replaced or cut short while it"
                f" wrote them ({', '.join(lost)}): if they were moved, move them back (or give"
                " their new paths) and run again to resume; if they are gone or were cut"
                " short (a log rotation), run again with --restart to tag every row again"
            )
        if self.failure is None:
            self.failure = lost_outputs(lost)


def lost_outputs(paths: list[str]) -> str:
    """A job's failure when outputs it wrote were removed or replaced under it."""
    return (
        f"its outputs were removed, renamed, replaced or cut short after lines were written"
        f" to them"
        f" ({', '.join(paths)}): those lines are not there (the counts include them), so its"
        " rows must be tagged again to have them all"
    )


class IdSpace:
    """How ids are sent to the service: as they are (one job), or ``JOB/ID`` (several)."""

    def __init__(self, namespaced: bool) -> None:
        self.namespaced = namespaced

    def sent(self, job: int, ident: str) -> str:
        return f"{job}/{ident}" if self.namespaced else ident

    def split(self, sent: str) -> tuple[int | None, str]:
        """(job, id) of a sent id: job None when ids are sent as they are (one job), -1 when
        a namespaced id is not one of ours (no ``JOB/`` prefix)."""
        if not self.namespaced:
            return None, sent
        head, sep, ident = sent.partition("/")
        if not sep or not head.isdigit():
            return -1, sent
        return int(head), ident


class Jobs:
    """The jobs in flight: lookup by id and by position, and outcome routing."""

    def __init__(self, ids: IdSpace) -> None:
        self.ids = ids
        self.by_id: dict[int, Job] = {}
        self._by_source: dict[int, Job] = {}
        #: The one job of an engine that does not namespace ids.
        self.only: Job | None = None

    def add(self, job: Job) -> None:
        self.by_id[job.id] = job
        for src, _ in job.row.sources:
            self._by_source[src] = job
        if not self.ids.namespaced:
            self.only = job

    def remove(self, job: Job) -> None:
        self.by_id.pop(job.id, None)
        if self.only is job:  # its rows are no longer in flight (see group_rows)
            self.only = None
        for src, _ in job.row.sources:
            self._by_source.pop(src, None)

    def made_again(self) -> None:
        """Each job's outputs removed before their first line made again at their paths
        (:meth:`~.sinks._AppendFile.made_again`; in the state thread)."""
        for job in list(self.by_id.values()):
            job.results.made_again()
            job.rejects.made_again()

    def of_key(self, key: str) -> Job | None:
        """The job in flight of ``key``, None when there is none."""
        return next((job for job in self.by_id.values() if job.row.key == key), None)

    def of_source(self, source: int) -> Job | None:
        return self._by_source.get(source)

    def of_pos(self, pos: int) -> Job | None:
        return self._by_source.get(pos >> POS_SHIFT)

    def source_name(self, pos: int) -> str:
        job = self.of_pos(pos)
        return job.sources.get(pos >> POS_SHIFT, "?") if job is not None else "?"

    def reject(self, pos: int, ident: str | None, reason: str, stage: str) -> tuple[int, Reject]:
        """The rejects line of the row at ``pos`` (``ident``: its manifest's id, or None), for
        its job's outputs."""
        job = self.of_pos(pos)
        reject = Reject(ident, reason, stage, pos & _LINE_MASK, self.source_name(pos))
        return (job.id if job is not None else -1), reject

    def group_rows(self, rows: list[PageRow], job: int | None = None) -> dict[int, list[PageRow]]:
        """A page's rows by job, with the ids of their manifests. ``job`` given: every row is
        that job's and carries its own id already (the single endpoint). Rows of no job in
        flight (not ours, or of a job already complete) are left out."""
        if job is not None:
            return {job: rows}
        if not self.ids.namespaced:
            only = self.only
            return {only.id: rows} if only is not None and not only.closed and rows else {}
        out: dict[int, list[PageRow]] = {}
        split = self.ids.split
        by_id = self.by_id
        for r in rows:
            jid, ident = split(r.id)
            if jid is not None and (found := by_id.get(jid)) is not None and not found.closed:
                out.setdefault(jid, []).append(PageRow(ident, r.tagging_result))
        return out

    def original(self, sent: str) -> str:
        """The manifest's id of an id as sent."""
        return self.ids.split(sent)[1]

    def is_open(self, pos: int) -> bool:
        return self.of_pos(pos) is not None

    def count_by_job(self, positions: Iterable[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        by_source = self._by_source
        for pos in positions:
            job = by_source.get(pos >> POS_SHIFT)
            if job is not None:
                out[job.id] = out.get(job.id, 0) + 1
        return out

    def marks(self, positions: Sequence[int]) -> list[tuple[int, int]]:
        """(job, last position) of each job with rows among ``positions``."""
        last: dict[int, int] = {}
        by_source = self._by_source
        for pos in positions:
            job = by_source.get(pos >> POS_SHIFT)
            if job is not None and pos > last.get(job.id, -1):
                last[job.id] = pos
        return list(last.items())

    def check(self, job_ids: Iterable[int]) -> None:
        """Mark settled every job of ``job_ids`` read to the end with no row in flight."""
        for jid in job_ids:
            job = self.by_id.get(jid)
            if job is not None and job.read_all and job.pending() <= 0:
                job.settled.set()
