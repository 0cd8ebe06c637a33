"""The outbox on real folders: STEM naming, one folder per claim (resume finds its own, other
content and duplicates get STEM.<sha12>), summary.json written last and whole."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import msgspec
import pytest

from fashiontag_pipeline.daemon import outbox as outbox_module
from fashiontag_pipeline.daemon.inbox import Claim
from fashiontag_pipeline.daemon.interface import ManifestOutcome
from fashiontag_pipeline.daemon.outbox import ManifestSummary, Outbox, rfc3339

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def claim_of(name: str, content: bytes, claimed_at: float = 1_700_000_000.25) -> Claim:
    return Claim(
        name=name,
        path=f"/inbox/.work/{name}",
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
        claimed_at=claimed_at,
    )


def test_stem_folder_and_file_names(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "out")
    outbox.prepare()
    outputs = outbox.outputs(claim_of("cat.jsonl.gz", b"a"))
    assert outputs.folder == tmp_path / "out" / "cat"
    assert outputs.results == outputs.folder / "results.jsonl"
    assert outputs.rejects == outputs.folder / "rejects.jsonl"
    assert outputs.summary == outputs.folder / "summary.json"


def test_a_resumed_claim_finds_its_own_folder(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    claim = claim_of("cat.csv", b"a")
    first = outbox.outputs(claim)
    first.results.write_bytes(b'{"id":"1"}\n')
    again = Outbox(tmp_path).outputs(msgspec.structs.replace(claim, resumed=True))
    assert again.folder == first.folder
    assert again.results.read_bytes() == b'{"id":"1"}\n'


def test_other_content_and_duplicates_never_share_a_folder(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    a = claim_of("cat.csv", b"a")
    b = claim_of("cat.csv.gz", b"b")
    a_again = claim_of("cat.csv", b"a", claimed_at=1_700_000_100.0)  # a duplicate, later
    a_third = claim_of("cat.ndjson", b"a", claimed_at=1_700_000_200.0)
    folders = [outbox.outputs(c).folder.name for c in (a, b, a_again, a_third)]
    assert folders == [
        "cat",
        f"cat.{b.sha256[:12]}",
        f"cat.{a.sha256[:12]}",
        f"cat.{a.sha256[:12]}.2",
    ]


def test_a_foreign_folder_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "notes.txt").write_text("somebody's")
    claim = claim_of("cat.csv", b"a")
    assert Outbox(tmp_path).outputs(claim).folder.name == f"cat.{claim.sha256[:12]}"
    # An empty folder (a crash between mkdir and the claim mark) is adopted.
    (tmp_path / "dog").mkdir()
    assert Outbox(tmp_path).outputs(claim_of("dog.csv", b"d")).folder.name == "dog"


def test_summary_is_written_last_and_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = Outbox(tmp_path).outputs(claim_of("cat.csv", b"a"))
    outputs.results.write_bytes(b'{"id":"1"}\n')
    outcome = ManifestOutcome(status="done", rows_read=3, tagged=1, failed=1, rejected=1, tasks=1)
    summary = outcome.summary(outputs, finished_at=1_700_000_060.5)

    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def recording_rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        renames.append((Path(src).name, Path(dst).name))
        real_rename(src, dst)

    monkeypatch.setattr(outbox_module.os, "rename", recording_rename)
    assert not outputs.is_complete()
    outputs.write_summary(summary)
    monkeypatch.undo()
    [(temp, final)] = renames
    assert final == "summary.json"
    assert re.fullmatch(rf"\.summary\.json\.{os.getpid()}-[0-9a-f]{{8}}\.tmp", temp), temp
    assert outputs.is_complete()
    assert outputs.rejects.read_bytes() == b""  # created, empty: all three files exist
    data = json.loads(outputs.summary.read_text())
    for field in ("rows_read", "tagged", "failed", "rejected", "tasks"):
        assert field in data
    assert data["manifest"] == "cat.csv"
    assert data["sha256"] == hashlib.sha256(b"a").hexdigest()
    assert data["status"] == "done"
    assert data["claimed_at"] == "2023-11-14T22:13:20.250Z"
    assert data["finished_at"] == "2023-11-14T22:14:20.500Z"
    assert RFC3339_MS.match(data["finished_at"])
    assert data["duplicate_of"] is None
    assert outputs.read_summary() == summary
    assert sorted(p.name for p in outputs.folder.iterdir()) == [
        ".claim",
        "rejects.jsonl",
        "results.jsonl",
        "summary.json",
    ]


def test_duplicate_and_failed_summaries(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    dup = outbox.outputs(claim_of("again.csv", b"a"))
    dup.write_summary(dup.new_summary("duplicate", finished_at=1e9, duplicate_of="cat.csv"))
    data = json.loads(dup.summary.read_text())
    assert (data["status"], data["duplicate_of"], data["tagged"]) == ("duplicate", "cat.csv", 0)
    assert dup.results.read_bytes() == b""

    bad = outbox.outputs(claim_of("bad.csv", b"x"))
    outcome = ManifestOutcome(status="failed", reason="no url column")
    bad.write_summary(outcome.summary(bad, finished_at=1e9))
    data = json.loads(bad.summary.read_text())
    assert (data["status"], data["reason"]) == ("failed", "no url column")


def test_rfc3339_has_milliseconds_in_utc() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_700_000_000.1239) == "2023-11-14T22:13:20.123Z"


def test_summary_struct_round_trips() -> None:
    summary = ManifestSummary(
        manifest="a.csv", sha256="0" * 64, status="done", claimed_at="x", finished_at="y"
    )
    assert msgspec.json.decode(msgspec.json.encode(summary), type=ManifestSummary) == summary


async def test_the_async_twins_do_the_file_work_off_the_loop(tmp_path: Path) -> None:
    """aoutputs/awrite_summary: the same folders and summary, from a worker thread."""
    outbox = Outbox(tmp_path)
    outputs = await outbox.aoutputs(claim_of("cat.csv", b"a"))
    assert outputs.folder == tmp_path / "cat"
    assert (await outbox.aoutputs(claim_of("cat.csv", b"a"))).folder == outputs.folder
    summary = ManifestOutcome(status="done", tagged=2).summary(outputs, finished_at=1.7e9)
    await outputs.awrite_summary(summary)
    assert outputs.read_summary() == summary and outputs.results.exists()


def test_a_name_near_the_file_system_limit_gets_folders_that_fit(tmp_path: Path) -> None:
    """A legal manifest name of 248 bytes (here with multi-byte characters): its second
    content needs ``STEM.<sha12>``, cut to fit 255 bytes at a character boundary, never an
    error that stops the daemon."""
    outbox = Outbox(tmp_path)
    name = "é" * 60 + "c" * 124 + ".csv"  # 244 + 4 bytes
    assert len(name.encode()) == 248
    first = outbox.outputs(claim_of(name, b"a"))
    second = outbox.outputs(claim_of(name, b"b"))
    assert first.folder.name == name[:-4]
    assert second.folder != first.folder and second.folder.is_dir()
    assert len(second.folder.name.encode()) <= 255
    assert second.folder.name.endswith(f".{claim_of(name, b'b').sha256[:12]}")


def test_a_folder_removed_under_a_job_in_flight_is_not_given_to_another_claim(
    tmp_path: Path,
) -> None:
    """A cleanup removed the folder of a manifest still in flight (its job makes it again and
    writes its summary there): a claim of the same stem must not take it, and the resumed
    claim takes its recorded folder back even without its mark, but never one another claim
    has marked."""
    outbox = Outbox(tmp_path / "out")
    outbox.prepare()
    first = claim_of("m.csv", b"first")
    folder = outbox.outputs(first).folder
    shutil.rmtree(tmp_path / "out")
    other = outbox.outputs(claim_of("m.jsonl", b"second"), taken=[folder])
    assert other.folder != folder and other.folder.parent == tmp_path / "out"
    folder.mkdir()
    (folder / "results.jsonl").write_bytes(b"")  # made again by the job's outputs
    assert outbox.outputs(first, recorded=folder).folder == folder
    third = claim_of("x.csv", b"third")
    assert outbox.outputs(third, recorded=folder).folder != folder  # marked by another claim


@pytest.mark.parametrize("link_errno", [None, 1, 95])  # works; EPERM; EOPNOTSUPP
def test_marks_are_exclusive_with_or_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link_errno: int | None
) -> None:
    """The mark is linked in whole (a kill never leaves it empty); a filesystem without hard
    links (some network and FUSE mounts) takes it by rename when absent. Either way a resumed
    claim finds its folder, another content gets STEM.<sha12>, and no temp file is left."""
    if link_errno is not None:

        def no_links(src: object, dst: object) -> None:
            raise OSError(link_errno, os.strerror(link_errno))

        monkeypatch.setattr(outbox_module.os, "link", no_links)
    outbox = Outbox(tmp_path)
    a, b = claim_of("cat.csv", b"a"), claim_of("cat.csv", b"b")
    first = outbox.outputs(a)
    assert first.folder.name == "cat"
    assert Outbox(tmp_path).outputs(msgspec.structs.replace(a, resumed=True)).folder == first.folder
    other = outbox.outputs(b)
    assert other.folder.name == f"cat.{b.sha256[:12]}"
    assert sorted(os.listdir(first.folder)) == [".claim"]
    assert sorted(os.listdir(other.folder)) == [".claim"]


@pytest.mark.parametrize("when", ["before_the_mark", "before_the_link", "before_the_look"])
def test_yesterdays_folder_collected_while_a_new_claim_of_its_name_is_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Yesterday's ``cat/`` (complete: its summary written) is moved away by the outbox's
    collector (``mv OUTBOX/cat /archive/``) at the moment the daemon claims tonight's
    ``cat.csv`` and finds the folder taken: the mark written into it, or linked in, met a
    folder that was gone, the FileNotFoundError stopped the daemon (exit 1, every manifest
    in flight cut off, ``daemon stopped on an error: ... .claim.<pid>.<hex>.tmp``). The
    folder is looked at again: tonight's outputs go to ``cat`` (free now)."""
    root = tmp_path / "out"
    archive = tmp_path / "archive"
    archive.mkdir()
    yesterday = Outbox(root).outputs(claim_of("cat.csv", b"yesterday", claimed_at=1.0))
    yesterday.results.write_bytes(b'{"id":"1"}\n')
    yesterday.write_summary(yesterday.new_summary("done", finished_at=2.0))
    moved: list[Path] = []

    def collect() -> None:
        if not moved:
            moved.append(archive / "cat")
            os.rename(root / "cat", archive / "cat")

    real_open, real_link, real_scandir = os.open, os.link, os.scandir

    def opening(path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:
        if when == "before_the_mark" and Path(path).name.startswith(".claim."):
            collect()
        return real_open(path, flags, mode)

    def linking(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if when == "before_the_link":
            collect()
        real_link(src, dst)

    def scanning(path: str | os.PathLike[str]) -> object:
        if when == "before_the_look" and Path(path).name == "cat":
            collect()
        return real_scandir(path)

    if when == "before_the_look":  # the folder had no mark (a crash after its mkdir)
        (root / "cat" / ".claim").unlink()
    monkeypatch.setattr(outbox_module.os, "open", opening)
    monkeypatch.setattr(outbox_module.os, "link", linking)
    monkeypatch.setattr(outbox_module.os, "scandir", scanning)
    claim = claim_of("cat.csv", b"tonight")
    outputs = Outbox(root).outputs(claim)
    monkeypatch.undo()
    assert moved, "the collector never ran"
    assert outputs.folder == root / "cat"
    mark = json.loads((outputs.folder / ".claim").read_bytes())
    assert mark["sha256"] == claim.sha256
    # The folder collected is whole as it was: yesterday's summary and results.
    assert json.loads((archive / "cat" / "summary.json").read_bytes())["sha256"] == (
        yesterday.claim.sha256
    )
    assert (archive / "cat" / "results.jsonl").read_bytes() == b'{"id":"1"}\n'


def test_two_daemons_writing_one_summary_at_once_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons of a shared state settle one manifest at one moment (the one paused past
    its lease and the one that took it over), each writing the same summary.json: both wrote
    one temp name, the first rename took the other's temp file away, and the second daemon
    stopped on an error (exit 1: "No such file or directory: '.summary.json.tmp' ->
    'summary.json'"; the wide daemon fuzz, seed 277, under load). Each write has its own temp
    file now, and the file is whole whichever rename comes last."""
    from fashiontag_pipeline.daemon import _files

    target = tmp_path / "summary.json"
    real_fsync = os.fsync
    nested: list[bool] = []

    def fsync_then_another_writer(fd: int) -> None:
        real_fsync(fd)
        if not nested:  # the other daemon writes the file whole between our fsync and rename
            nested.append(True)
            _files.write_atomic(target, b'{"by":"b"}\n')

    monkeypatch.setattr(_files.os, "fsync", fsync_then_another_writer)
    _files.write_atomic(target, b'{"by":"a"}\n')
    monkeypatch.undo()
    assert nested
    assert target.read_bytes() == b'{"by":"a"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left
