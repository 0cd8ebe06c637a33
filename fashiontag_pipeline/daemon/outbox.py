"""The outbox: one folder of outputs per manifest, complete exactly when its summary exists.

::

    OUTBOX/STEM/results.jsonl    one line per tagged image (the format of `run --out`)
    OUTBOX/STEM/rejects.jsonl    one line per row without a result
    OUTBOX/STEM/summary.json     written last, by atomic rename: the manifest is complete
    OUTBOX/STEM/.claim           which claim owns the folder (manifest, sha256, claimed_at)

STEM is the manifest's name without ``.gz`` and ``.csv``/``.jsonl``/``.ndjson``. A folder
belongs to one claim: a resumed claim finds its own folder again by ``.claim``; any other
claim whose STEM is taken (another content, or the same content dropped again, which is a
``duplicate`` and must not overwrite the summary it duplicates) gets ``STEM.<sha12>``, then
``STEM.<sha12>.2``, ... Folders are created with ``mkdir`` (which fails if the name exists), so
two claims can never share one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from .._models import format_time
from ._files import fsync_dir, write_atomic
from .inbox import Claim
from .names import fit, manifest_stem

__all__ = [
    "CLAIM_FILE",
    "REJECTS_FILE",
    "RESULTS_FILE",
    "SUMMARY_FILE",
    "ManifestCounts",
    "ManifestOutputs",
    "ManifestStatus",
    "ManifestSummary",
    "Outbox",
    "rfc3339",
]

RESULTS_FILE = "results.jsonl"
REJECTS_FILE = "rejects.jsonl"
SUMMARY_FILE = "summary.json"
CLAIM_FILE = ".claim"

ManifestStatus = Literal["done", "failed", "duplicate"]


def rfc3339(unix_time: float) -> str:
    """Unix time as RFC 3339 UTC with milliseconds: ``2026-11-22T03:46:13.123Z``."""
    return format_time(datetime.fromtimestamp(unix_time, UTC))


class ManifestCounts(msgspec.Struct, kw_only=True):
    """``run --summary``'s counts for one manifest's rows (shared by the engine's outcome and
    ``summary.json``)."""

    rows_read: int = 0
    submitted: int = 0
    tagged: int = 0
    failed: int = 0
    rejected: int = 0
    #: Rows answered from the result store (``--reuse``), written without a request.
    reused: int = 0
    tasks: int = 0
    pages: int = 0
    single: int = 0
    retries: int = 0
    rate_limited: int = 0
    resent: int = 0
    elapsed_s: float = 0.0


class ManifestSummary(ManifestCounts, kw_only=True):
    """``summary.json``: the counts for this manifest, plus where it came from and how it
    ended. ``duplicate_of`` names the earlier manifest file for a ``duplicate``; ``reason``
    says why for a ``failed`` one."""

    manifest: str
    sha256: str
    status: ManifestStatus
    claimed_at: str
    finished_at: str
    duplicate_of: str | None = None
    reason: str | None = None


class _ClaimMark(msgspec.Struct, frozen=True, kw_only=True):
    manifest: str
    sha256: str
    claimed_at: float


_summary_encoder = msgspec.json.Encoder()
_summary_decoder = msgspec.json.Decoder(ManifestSummary)
_mark_decoder = msgspec.json.Decoder(_ClaimMark)


class ManifestOutputs:
    """The output folder of one claim."""

    def __init__(self, folder: Path, claim: Claim) -> None:
        self.folder = folder
        self.claim = claim

    @property
    def results(self) -> Path:
        return self.folder / RESULTS_FILE

    @property
    def rejects(self) -> Path:
        return self.folder / REJECTS_FILE

    @property
    def summary(self) -> Path:
        return self.folder / SUMMARY_FILE

    def is_complete(self) -> bool:
        """Whether ``summary.json`` exists (the manifest is complete)."""
        return self.summary.exists()

    def read_summary(self) -> ManifestSummary | None:
        """The written summary, or None before it is written."""
        try:
            return _summary_decoder.decode(self.summary.read_bytes())
        except FileNotFoundError:
            return None

    def new_summary(
        self,
        status: ManifestStatus,
        *,
        finished_at: float,
        duplicate_of: str | None = None,
        reason: str | None = None,
    ) -> ManifestSummary:
        """A summary of this claim with zero counts (the engine fills its counts in)."""
        return ManifestSummary(
            manifest=self.claim.name,
            sha256=self.claim.sha256,
            status=status,
            claimed_at=rfc3339(self.claim.claimed_at),
            finished_at=rfc3339(finished_at),
            duplicate_of=duplicate_of,
            reason=reason,
        )

    def earlier_or(self, summary: ManifestSummary) -> ManifestSummary:
        """The summary this very claim wrote with the same status before a crash (a SIGKILL
        after ``summary.json``, before the move to ``done/``): a consumer may have taken it,
        so it stays as it was (its ``finished_at``, its ``elapsed_s``); else ``summary``."""
        try:
            earlier = self.read_summary()
        except (OSError, msgspec.DecodeError):
            return summary

        def of(s: ManifestSummary) -> tuple[str, str, str, str]:
            return (s.manifest, s.sha256, s.claimed_at, s.status)

        return earlier if earlier is not None and of(earlier) == of(summary) else summary

    async def aearlier_or(self, summary: ManifestSummary) -> ManifestSummary:
        """:meth:`earlier_or` in a worker thread."""
        return await anyio.to_thread.run_sync(self.earlier_or, summary)

    def write_summary(self, summary: ManifestSummary) -> None:
        """Write ``summary.json`` last: results and rejects are fsync-ed first, and any that
        were never opened (a failed or duplicate manifest) are created empty, so a consumer
        that sees the summary always finds all three files whole."""
        # A folder removed while the manifest was in flight is made again for its summary.
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (self.results, self.rejects):
            with path.open("ab") as fh:
                os.fsync(fh.fileno())
        data = _summary_encoder.encode(summary) + b"\n"
        try:
            if self.summary.read_bytes() == data:
                return  # written before a crash (earlier_or): left as it is
        except OSError:
            pass
        write_atomic(self.summary, data)

    async def awrite_summary(self, summary: ManifestSummary) -> None:
        """:meth:`write_summary` in a worker thread (it fsyncs outputs of any size)."""
        await anyio.to_thread.run_sync(self.write_summary, summary)


def _is_mark_name(name: str) -> bool:
    """The mark, or one of its temporary files (being written, or left by a crash)."""
    return name == CLAIM_FILE or (name.startswith(f"{CLAIM_FILE}.") and name.endswith(".tmp"))


#: ``link`` refused by a filesystem that has no hard links (some network and FUSE mounts).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})


def _link_exclusively(tmp: Path, path: Path) -> bool:
    """``tmp`` becomes ``path`` unless ``path`` exists (False then). Where the filesystem has
    no hard links, ``path`` is created exclusively (``O_EXCL``) and ``tmp``'s bytes written to
    it: a kill in between can leave it partial there (read as another's), but two daemons can
    never both take it. (A rename when ``path`` is absent, read back after, could: one looks,
    the other looks, renames and reads its own back, then the first renames over it and reads
    its own back.)"""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in _NO_LINKS:
            raise
    data = tmp.read_bytes()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.unlink(path)  # (a full disk: no empty mark left to make the folder nobody's)
        raise
    finally:
        os.close(fd)
    return True


#: Times a folder that vanishes while it is being taken is looked at again.
_VANISHED_TRIES = 3


class Outbox:
    """Allocates output folders under ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        # Absolute, as the engine records a job's outputs (a relative --outbox resumes its
        # folders, not "another outbox").
        self.root = Path(os.path.abspath(root))

    @staticmethod
    def folder_of(results: str) -> Path:
        """The folder of a job's results file as recorded (one an older build recorded
        relative: from the working directory, as the engine takes it)."""
        return Path(os.path.abspath(results)).parent

    def prepare(self) -> None:
        """Create the outbox folder if needed."""
        self.root.mkdir(parents=True, exist_ok=True)

    def outputs(
        self, claim: Claim, recorded: Path | None = None, taken: Collection[Path] = ()
    ) -> ManifestOutputs:
        """The folder of this claim: found again when it already has one (a resumed claim),
        else created under the first free name of ``STEM``, ``STEM.<sha12>``,
        ``STEM.<sha12>.2``, ...

        ``recorded``: the folder the state store says the claim's job writes to (a resumed
        claim). It is the claim's even when its mark is gone (the folder was removed and the
        job's outputs made again), and is marked again, unless another claim's mark is in it;
        in another outbox (the daemon restarted with another ``--outbox``) too: the manifest
        ends where its rows were written, its summary beside them.
        ``taken``: folders other jobs in flight write to, never given to this claim even when
        they are gone (removed under a job, which makes them again)."""
        mark = _ClaimMark(manifest=claim.name, sha256=claim.sha256, claimed_at=claim.claimed_at)
        # The outbox itself may have been removed since start-up (a cleanup job).
        self.root.mkdir(parents=True, exist_ok=True)
        # (The job's outputs, opened when the engine started, made the folder again if gone.)
        if recorded is not None and recorded.is_dir() and self._take(recorded, mark, adopt=True):
            return ManifestOutputs(recorded, claim)
        stem = manifest_stem(claim.name)
        candidates = [stem, fit(stem, f".{claim.sha256[:12]}")]
        n = 2
        while True:
            for candidate in candidates:
                folder = self.root / candidate
                if folder not in taken and self._take(folder, mark):
                    return ManifestOutputs(folder, claim)
            candidates = [fit(stem, f".{claim.sha256[:12]}.{n}")]
            n += 1

    async def aoutputs(
        self, claim: Claim, recorded: Path | None = None, taken: Collection[Path] = ()
    ) -> ManifestOutputs:
        """:meth:`outputs` in a worker thread (it creates and fsyncs folders)."""
        return await anyio.to_thread.run_sync(self.outputs, claim, recorded, taken)

    def _take(self, folder: Path, mark: _ClaimMark, *, adopt: bool = False) -> bool:
        """Whether ``folder`` is this claim's: created now, or marked as its own before. One
        that vanishes while it is looked at (the outbox's collector moving yesterday's
        ``STEM`` away) is looked at again: free now, it is made (a FileNotFoundError out of
        here stopped the daemon)."""
        for tries in range(1, _VANISHED_TRIES + 1):
            try:
                return self._take_once(folder, mark, adopt=adopt)
            except FileNotFoundError:
                if tries == _VANISHED_TRIES or folder.is_dir() or not folder.parent.is_dir():
                    raise  # not the folder vanishing (the outbox itself gone, say)
        raise AssertionError("unreachable")

    def _take_once(self, folder: Path, mark: _ClaimMark, *, adopt: bool) -> bool:
        """:meth:`_take`, once.

        The mark is written whole under a name of its own, then linked in as ``.claim``,
        which fails if a mark exists: of two daemons on a shared outbox that want the same
        folder at once, one takes it and the other reads its mark and moves on, and a mark is
        never seen empty or partial (a kill between creating a mark and writing it left an
        empty one, and the folder was nobody's for ever: the outputs went to STEM.<sha12>),
        except on a filesystem without hard links (see :func:`_link_exclusively`).
        A folder without a mark (a crash between mkdir and the mark) is adopted the same way
        if it holds nothing else (``adopt``: whatever it holds, the state says it is ours); a
        folder holding anything else is somebody's, not ours."""
        try:
            folder.mkdir()
            fsync_dir(self.root)
        except FileExistsError:
            if not folder.is_dir():
                return False
        data = msgspec.json.encode(mark)
        path = folder / CLAIM_FILE
        tmp = folder / f"{CLAIM_FILE}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as err:  # a full disk: the error names the mark, which is not left
                if err.filename is None:
                    raise OSError(err.errno, err.strerror, str(path)) from err
                raise
            if not _link_exclusively(tmp, path):
                try:
                    return _mark_decoder.decode(path.read_bytes()) == mark
                except (OSError, msgspec.DecodeError):
                    return False  # another's mark, damaged: not ours
        finally:
            tmp.unlink(missing_ok=True)
        try:
            with os.scandir(folder) as entries:
                foreign = any(not _is_mark_name(e.name) for e in entries)
        except OSError:
            foreign = True
        if foreign and not adopt:
            os.unlink(path)  # (the folder gone meanwhile: FileNotFoundError, looked at again)
            return False
        fsync_dir(folder)
        return True
