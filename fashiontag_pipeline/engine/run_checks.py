"""The checks ``run_pipeline`` makes before a run starts, and what it asks of the outputs.

Whether the outputs a resumed run's state counts lines in are still where it wrote them (or
moved with the command line), whether they are free (no other run writes them) and regular
files, whether the paths can be recorded (UTF-8), and whether the language and detection
asked are those the state's run was tagged with.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig
from .config import EngineConfig
from .manifest_bytes import stdin_file
from .outfiles import lock_output
from .outnames import COMPRESSED_SUFFIXES, compressed_name, finish_older, undecodable_path
from .sinks import committed_last_id
from .state import JobRow, StateStore

__all__ = [
    "ASKED",
    "COMPRESSED_SUFFIXES",
    "a_folder",
    "absolute",
    "absolute_outputs",
    "asked_text",
    "check_asked",
    "check_sink",
    "describe_asked",
    "file_size",
    "folder_blocked",
    "not_a_file",
    "not_a_folder",
    "not_state_file",
    "not_utf8",
    "outputs_elsewhere",
    "outputs_free",
    "outputs_without_state",
    "rewritten_since",
    "same_file",
    "same_tail",
]


def outputs_elsewhere(job: JobRow | None, out: Path, rejects: Path) -> tuple[str, bool]:
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
            if file_size(given) >= needed and (
                file_size(Path(written)) < needed or (in_bytes and same_tail(given, written, ckpt))
            ):
                continue  # moved or copied to the path given, lines and all
            elsewhere = True
            problems.append(f"its {what} were written to {written}, not {given}")
            continue
        size = file_size(given)
        if size < needed:
            state = "is missing" if size < 0 else "holds fewer lines than were committed"
            problems.append(f"its {what} file {given} {state}")
    return "; ".join(problems), elsewhere


def rewritten_since(db: StateStore, job: JobRow | None, out: Path, rejects: Path) -> str:
    """What of a complete run's JSONL outputs, at the paths it wrote, is another run's now
    ("" when nothing is). A complete run's file ends at its checkpoint with a line of one of
    its tasks; another run given the same path (a state copied back from a backup, a state
    per weekday beside one results file) rewrote it otherwise. A line answered from the
    result store names an earlier run's task: only its place is checked."""
    if job is None:
        return ""
    problems: list[str] = []
    files = (
        ("results", out, job.results, job.results_ckpt, job.sink != "sqlite"),
        ("rejects", rejects, job.rejects, job.rejects_ckpt, True),
    )
    for what, given, written, ckpt, jsonl in files:
        if not jsonl or ckpt <= 0 or os.path.realpath(given) != os.path.realpath(written):
            continue  # (nothing committed to it; or the file elsewhere: outputs_elsewhere)
        size = file_size(given)
        if size < ckpt:
            continue  # (lines lost: outputs_elsewhere says so)
        fits, line = committed_last_id(given, ckpt) if size == ckpt else (False, None)
        if fits and line is not None and line.task_id is not None and not line.reused:
            fits = what != "results" or db.task_known(line.task_id)
        if not fits:
            problems.append(
                f"its {what} file {given} was written by another run since (it does not end"
                f" with this run's {ckpt:,} bytes)"
            )
    return "; ".join(problems)


def same_tail(given: Path, written: str, end: int, span: int = 4096) -> bool:
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
ASKED = "asked"


def asked_text(language: str, detection: Sequence[str] | None) -> str:
    return msgspec.json.encode(
        {"language": language, "detection": sorted(detection) if detection else None}
    ).decode()


def describe_asked(asked: str) -> str:
    options = msgspec.json.decode(asked, type=dict[str, Any])
    detection = options.get("detection")
    shown = ",".join(detection) if detection else "the service's default"
    return f"--language {options.get('language')} and --detection {shown}"


#: The meta key of the directory a run reads its relative image paths from: the working
#: directory of its first start, so that a resume from another directory reads the same files.
PATHS_BASE = "paths_base"


def paths_base(recorded: str | None) -> str | None:
    """The directory relative image paths are read from: the one the run recorded, else this
    process's working directory; None when that cannot be recorded (a name not UTF-8: the
    validator's own working directory then)."""
    if recorded is not None:
        return recorded
    try:
        base = os.getcwd()
        base.encode()
    except (OSError, UnicodeEncodeError):
        return None
    return base


def check_asked(where: str, before: str | None, asked: str) -> None:
    """A resumed run must ask its rows what the run was begun with: rows already sent were
    asked that (their results are read in its language), and a result store files results by
    the question (``--reuse``)."""
    if before is None or before == asked:
        return
    raise exc.ResumeMismatchError(
        f"{where} holds an unfinished run begun with {describe_asked(before)}; this command"
        f" gives {describe_asked(asked)}: resume it with the options it was begun with, so"
        " that every row is answered alike, or pass --restart to start over (every row is"
        " tagged again)"
    )


def check_sink(where: str, job: JobRow | None, sink: str, out: Path) -> None:
    """A resumed run writes its results in the format its committed lines are in: the other
    sink took the file for another run's (its checkpoint, rows or bytes, read the other way)
    or for one that is not a database, and said to start over or give another ``--out``."""
    if job is None or job.results_ckpt <= 0:
        return  # (no result committed yet: nothing to read back in the old format)
    if not job.results:
        # A run of a build before jobs, which recorded neither its outputs nor its sink (its
        # job says jsonl): the format of its results file (``out``) tells, before anything
        # is recorded (a refused attempt recorded the wrong sink as the run's for good).
        found = _sink_of(out)
        if found is None or found == sink:
            return  # (none there yet, or unreadable: the sinks say so)
        raise exc.StateConflictError(
            f"{where} holds an unfinished run begun with --sink {found}, whose results so far"
            f" are in {out} in that format; this command gives --sink {sink}: resume it with"
            f" --sink {found}, and change the sink once the run is complete"
        )
    if job.sink == sink:
        return
    raise exc.StateConflictError(
        f"{where} holds an unfinished run begun with --sink {job.sink}, whose results so far"
        f" are in {job.results} in that format; this command gives --sink {sink}: resume it"
        f" with --sink {job.sink}, and change the sink once the run is complete"
    )


def _sink_of(path: Path) -> str | None:
    """The sink that wrote ``path``: ``sqlite`` for a database's header, ``jsonl`` for any
    other start, None for a file not there, empty (a database's pages still in its WAL) or
    unreadable."""
    try:
        with path.open("rb") as file:
            head = file.read(16)
    except OSError:
        return None
    if not head:
        return None
    return "sqlite" if head == b"SQLite format 3\x00" else "jsonl"


def outputs_free(*paths: Path) -> None:
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


def same_file(named: Sequence[tuple[str, Path | str]]) -> str | None:
    """Why two of a run's files are one file (None when they are not): two sinks writing one
    file through two handles overwrite each other's lines, and an output on a manifest, the
    state or the result store destroys it (the sinks cut an output back to its checkpoint, 0
    for a new run, before a row is read). ``named``: (what the caller calls it, its path).
    A few ``stat`` calls, once per run or submit."""
    seen: dict[object, tuple[str, Path | str]] = {}
    for what, path in named:
        # An existing file is known by its inode, so a hard link is the same file too.
        try:
            info = stdin_file() if what == "manifest" and str(path) == "-" else os.stat(path)
            key: object = (info.st_dev, info.st_ino) if info else None
        except OSError:
            key = os.path.realpath(path)
        if key is None:
            continue  # stdin that is no file (a pipe, closed): no output can be it
        if key in seen:
            first, at = seen[key]
            if str(path) == "-" and what == "manifest":
                return f"{first} {at} is the file stdin reads (< {at}): give each its own file"
            if first == what == "manifest":  # (which two, else: "manifest and manifest")
                if os.path.abspath(at) == os.path.abspath(path):
                    return f"manifest {at} is given twice: give it once"
                return f"manifests {at} and {path} are one file (a link): give it once"
            return f"{first} and {what} are the same file ({path}): give each its own path"
        seen[key] = (what, path)
    return None


def absolute_outputs(
    client: object, engine: object, state: object, out: object, rejects: object
) -> tuple[Path, Path]:
    """``run_pipeline``'s outputs made absolute (recorded so: a resume from another working
    directory names the same files), once each argument is of its kind: else a TypeError
    naming the parameter, before anything is made (``client="http://..."`` was an
    AttributeError from deep inside, after the state file was made)."""
    path = (str, os.PathLike)
    kinds: list[tuple[str, object, tuple[type, ...], str]] = [
        (
            "client",
            client,
            (ClientConfig, TaggerClient),
            "a ClientConfig(base_url=...) or a TaggerClient",
        ),
        ("engine", engine, (EngineConfig,), "an EngineConfig"),
        ("out", out, path, "a path (str or Path)"),
        ("rejects", rejects, path, "a path (str or Path)"),
        ("state", state, (*path, StateStore, type(None)), "a path, a postgresql:// URL or None"),
    ]
    for name, value, types, what in kinds:
        if not isinstance(value, types):
            raise TypeError(f"{name}: {what}, not {type(value).__name__}")
    assert isinstance(out, str | os.PathLike) and isinstance(rejects, str | os.PathLike)
    return absolute(Path(out)), absolute(Path(rejects))


def absolute(path: Path) -> Path:
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
            return undecodable_path(what, text)
    return None


def not_a_file(named: Sequence[tuple[str, Path]], state: Path | str | None = None) -> str | None:
    """Why an output cannot be used (None when each can): one that exists and is not a
    regular file (``/dev/null``, ``/dev/stdout``, a pipe, a folder). A run cuts its outputs
    back to their last checkpoint to resume and fsyncs them, which only a file allows: on
    /dev/null the run tagged every row and then failed at its end, every night. Nor one named
    as a compressed file (``--out results.jsonl.gz``): the run wrote plain JSONL into it, exit
    0, and every loader that goes by the name (zcat, DuckDB, pandas, Spark) failed on it; a
    state file at ``state`` then holds a run of an older build: what finishes it is said."""
    for what, path in named:
        if blocked := folder_blocked(what, path):
            return blocked
        if compressed := compressed_name(what, path):
            return compressed + finish_older(named, state)
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


def not_a_folder(path: Path) -> Path | None:
    """The nearest of ``path`` and its parents that exists (a symlink to nothing too), when it
    is not a folder (a folder cannot be made there); None when the folder is there (a symlink
    to one too) or can be made."""
    for at in (path, *path.parents):
        if os.path.lexists(at):
            return None if at.is_dir() else at
    return None


def folder_blocked(what: str, path: Path) -> str | None:
    """Why the folder ``path`` is to be in cannot be made (None when it is there or can be):
    the nearest name above it that exists is a symlink to nothing (a file system not mounted
    tonight: ``mkdir`` said only "File exists") or a file ("Not a directory"); or ``path``
    is itself a symlink into a folder that does not exist ("unable to open database file",
    "No such file or directory")."""
    absolute = Path(os.path.abspath(path))
    if os.path.islink(absolute) and not os.path.exists(absolute):
        target = Path(os.path.realpath(absolute)).parent
        if not target.is_dir():
            return (
                f"{what} {path} is a symlink to {os.readlink(absolute)}: its folder {target}"
                " does not exist (a file system not mounted?): mount or make it, or give"
                " another path"
            )
    folder = not_a_folder(absolute.parent)
    if folder is None:
        return None
    if folder.is_symlink():
        return (
            f"{what} {path}: its folder {folder} is a symlink to {os.readlink(folder)},"
            " which does not exist (a file system not mounted?): mount or make it, or give"
            " another path"
        )
    return f"{what} {path}: its folder {folder} is not a folder: give another path"


def a_folder(named: Sequence[tuple[str, Path]]) -> str | None:
    """Why a file the run writes whole or as a database cannot be used (None when each can):
    one that is a folder (``--summary reports/``: every row was tagged, then the run failed at
    its end; ``--state`` one: SQLite's "unable to open database file"), or a device, a pipe or
    a socket (``--summary /dev/null`` replaced the device with a JSON file; a state or a store
    on one failed with "disk I/O error")."""
    for what, path in named:
        if blocked := folder_blocked(what, path):
            return blocked
        if compressed := compressed_name(what, path):
            return compressed
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # not there yet, or unreadable (its writer says so)
        if stat.S_ISDIR(mode):
            return f"{what} {path} is a folder: give the path of a file (in it, if you like)"
        if not stat.S_ISREG(mode):
            return (
                f"{what} {path} is not a regular file (a device, a pipe or a socket): the run"
                " replaces it whole or keeps a database in it; give the path of a file"
            )
    return None


def not_state_file(named: Sequence[tuple[str, Path | str]]) -> str | None:
    """Why a state file's path given to ``run_pipeline`` cannot be used (None when it can):
    empty (an unset variable: ``ValueError: PosixPath('.') has an empty name``) or a folder
    (SQLite's "unable to open database file"), as ``fashiontag run`` refuses ``--state``."""
    for what, path in named:
        if what == "state" and not str(path).strip():
            return "state is empty: give the path of a file or a postgresql:// URL"
    return a_folder([(what, Path(path)) for what, path in named if what == "state"])


def file_size(path: Path) -> int:
    """The size of a file in bytes, -1 when there is none."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


def outputs_without_state(location: str, out: Path, rejects: Path) -> str:
    """What a new run over outputs that are not empty says ("" when they are empty or
    missing): no state was found, so what they hold (a run's whose state was lost: a state
    on a tmpfs after a reboot) is rewritten and every row tagged again, as after a
    completed run of other manifests."""
    held = [f"{path} ({size:,} bytes)" for path in (out, rejects) if (size := file_size(path)) > 0]
    if not held:
        return ""
    return (
        f"no state at {location}, but {' and '.join(held)} already"
        f" hold{'s' if len(held) == 1 else ''} outcomes (a run whose state was lost, such as a"
        " state on a tmpfs after a reboot, or another program's): starting a new run; they are"
        " rewritten and every row is tagged again"
    )
