"""The inbox's moves when the file system says no: a manifest (or its marker) the daemon
cannot move, folders removed while it runs, a settled manifest that cannot leave ``.work``,
a file gone or replaced between its hash and its move. None of them may stop the daemon
(its claim loop dies of an exception, at every start), nor hold a name back in silence."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.inbox import Claim, Inbox
from fashiontag_pipeline.daemon.ledger import ClaimRecord, MemoryClaimLedger
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="posix file semantics")

CSV = b"id,url\n1,https://img.example/a.jpg\n2,https://img.example/b.jpg\n"


def _chattr(flag: str, path: Path) -> bool:
    """``chattr FLAG path``; False where it cannot be done (no tool, a file system without
    attributes, no CAP_LINUX_IMMUTABLE)."""
    if shutil.which("chattr") is None:
        return False
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


def _inbox(root: Path, ledger: MemoryClaimLedger | None = None) -> Inbox:
    root.mkdir(exist_ok=True)
    inbox = Inbox(
        root,
        ledger=ledger or MemoryClaimLedger(),
        settle=0.0,
        clock=lambda: 1000.0,
        wall_clock=lambda: 1.7e9,
    )
    inbox.prepare()
    return inbox


def _said(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if name in r.getMessage()]


# -- a manifest (or its marker) that cannot be moved into .work ---------------------------


@pytest.mark.parametrize("what", ["manifest", "marker"])
def test_a_manifest_that_cannot_be_moved_into_work_is_left_alone_said_once(
    tmp_path: Path, what: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EPERM from the claim's rename (a sticky drop folder, another account's file) or from
    the marker's unlink: no exception out of the claim (the daemon's claim loop died of it,
    at every start); the file is left alone, said once, its claim recorded abandoned, and the
    next manifest is claimed."""
    root = tmp_path / "inbox"
    inbox = _inbox(root)
    (root / "theirs.csv").write_bytes(CSV)
    if what == "marker":
        (root / "theirs.csv.ready").touch()
    (root / "zz-ok.csv").write_bytes(CSV.replace(b"a.jpg", b"c.jpg"))
    real_rename, real_unlink = os.rename, Path.unlink

    def rename(src: object, dst: object) -> None:
        if str(src).endswith("theirs.csv") and ".work" in str(dst):
            raise PermissionError(1, "Operation not permitted", str(src), None, str(dst))
        real_rename(src, dst)  # type: ignore[arg-type]

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == "theirs.csv.ready":
            raise PermissionError(1, "Operation not permitted", str(self))
        real_unlink(self, missing_ok=missing_ok)

    if what == "manifest":
        monkeypatch.setattr(os, "rename", rename)
    else:
        monkeypatch.setattr(Path, "unlink", unlink)
    claimed = []
    with caplog.at_level(logging.ERROR, "fashiontag_pipeline.daemon"):
        for _ in range(3):
            for path in inbox.scan():
                claim = inbox.claim(path)  # raised PermissionError before
                if claim is not None:
                    claimed.append(claim.name)
    assert claimed == ["zz-ok.csv"]
    [said] = _said(caplog, "theirs.csv")
    assert "cannot be claimed" in said and "Operation not permitted" in said
    assert (root / "theirs.csv").exists()
    record = inbox.ledger.lookup("theirs.csv")
    assert record is not None and record.status == "abandoned"
    monkeypatch.undo()
    os.chmod(root / "theirs.csv", 0o600)  # the operator's fix (chown, chattr -i): a new ctime
    [again] = inbox.scan()
    claim = inbox.claim(again)
    assert claim is not None and claim.name == "theirs.csv"


async def test_an_immovable_manifest_does_not_stop_the_daemon(tmp_path: Path) -> None:
    """A real daemon, a real EPERM: ``chattr +i`` makes the dropped file impossible to rename
    even for root (as a sticky drop folder does for another account's file). The daemon
    exited 1 at its first scan, and again at every start; ``ok.csv`` was never tagged."""
    await tag_beside_an_immovable_manifest(tmp_path)


async def tag_beside_an_immovable_manifest(tmp_path: Path, extra: Sequence[str] = ()) -> None:
    """A real daemon (``extra``: more of its arguments) with ``theirs.csv`` made immovable in
    its inbox (``chattr +i``; skipped where it cannot be done) and ``ok.csv`` dropped beside
    it: ``ok.csv`` is tagged, the daemon drains (exit 0), ``theirs.csv`` is said once and left
    where it is."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra)
        daemon.inbox.mkdir(parents=True)
        stuck = daemon.inbox / "theirs.csv"
        stuck.write_bytes(write_manifest(Path(), ["a", "b"]))
        if not _chattr("+i", stuck):
            pytest.skip("chattr +i is not available here")
        try:
            daemon.start()
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "ok.csv", write_manifest(Path(), ["c", "d"]))
            summary = await daemon.wait_summary("ok", timeout=30)
            daemon.check_alive()
            assert summary["status"] == "done" and summary["tagged"] == 2
            assert await daemon.stop() == 0
            said = [e for e in daemon.logs() if "theirs.csv" in str(e)]
            assert len(said) == 1, daemon.tail()
            assert stuck.exists() and not (daemon.inbox / ".work" / "theirs.csv").exists()
        finally:
            daemon.ensure_dead()
            _chattr("-i", stuck)


# -- a settled manifest left in .work holds back its name ---------------------------------


async def test_the_next_nights_manifest_of_the_same_name_is_tagged_after_done_was_removed(
    tmp_path: Path,
) -> None:
    """Night 1: ``catalogue.csv`` is tagged and moved to ``done/``; a cleanup job then removes
    ``done/``. Night 2's ``catalogue.csv`` was tagged but stayed in ``.work`` ("its folder is
    gone"), and night 3's waited for ever, nothing logged: the scan skipped every name
    ``.work`` held, settled or not. ``done/`` is made again, and every night is tagged."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            nights = [[f"n{night}-{i}" for i in range(5)] for night in range(3)]
            drop_atomic(daemon.inbox, "catalogue.csv", write_manifest(Path(), nights[0]))
            await daemon.wait_summary("catalogue", timeout=30)
            # The summary is written before the manifest moves to done/: the cleanup job runs
            # once it has moved, or it would find done/ empty and the move would make it again.
            with anyio.fail_after(10):
                while not (daemon.inbox / "done" / "catalogue.csv").exists():
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            shutil.rmtree(daemon.inbox / "done")  # the cleanup job
            seen: set[Path] = {daemon.outbox / "catalogue"}
            for night in nights[1:]:
                drop_atomic(daemon.inbox, "catalogue.csv", write_manifest(Path(), night))
                with anyio.fail_after(20):
                    while True:
                        daemon.check_alive()
                        new = {p.parent for p in daemon.outbox.glob("catalogue*/summary.json")}
                        if new - seen:
                            seen |= new
                            break
                        await anyio.sleep(0.05)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert len(seen) == 3
    assert len(list((daemon.inbox / "done").iterdir())) == 2  # nights 2 and 3
    assert not list((daemon.inbox / ".work").iterdir())


def _claimed(root: Path, ledger: MemoryClaimLedger | None = None) -> tuple[Inbox, Claim]:
    """An inbox at ``root`` with ``catalogue.csv`` dropped and claimed."""
    inbox = _inbox(root, ledger)
    (root / "catalogue.csv").write_bytes(CSV)
    [path] = inbox.scan()
    claim = inbox.claim(path)
    assert claim is not None
    return inbox, claim


def _exdev(real: Callable[..., None], *, only_from_work: bool) -> Callable[[object, object], None]:
    """``os.rename`` for ``done/`` on another file system: EXDEV for a rename into it from
    ``.work`` (or for every rename into it: no way in at all)."""

    def rename(src: object, dst: object) -> None:
        if "/done/" in str(dst) and (not only_from_work or "/.work/" in str(src)):
            raise OSError(18, "Invalid cross-device link", str(src), None, str(dst))
        real(src, dst)

    return rename


def test_a_settled_file_left_in_work_does_not_hold_back_its_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A settled file whose move failed stays in .work (the move is bookkeeping); a new file
    of that name was held back for ever ([] from every scan). Its record says it is settled:
    it is moved where the record says, and the new one is claimed."""
    root = tmp_path / "inbox"
    inbox, claim = _claimed(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "rename", _exdev(os.rename, only_from_work=False))  # no way in
        inbox.finish(claim, "done")
        assert (root / ".work" / "catalogue.csv").exists()
        (root / "catalogue.csv").write_bytes(CSV.replace(b"a.jpg", b"tonight.jpg"))
        assert inbox.scan() == [] and inbox.scan() == []  # still cannot: held back, said once
    assert len(_said(caplog, "a new catalogue.csv waits")) == 1
    assert inbox.scan() == [root / "catalogue.csv"]
    assert (root / "done" / "catalogue.csv").read_bytes() == CSV
    claim = inbox.claim(root / "catalogue.csv")
    assert claim is not None and b"tonight" in Path(claim.path).read_bytes()


def test_a_done_folder_on_another_file_system_gets_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``done/`` a mount of another file system: the rename out of ``.work`` fails (EXDEV),
    and the manifest stayed in ``.work``; it is copied (fsync, then the original removed)."""
    root = tmp_path / "inbox"
    inbox, claim = _claimed(root)
    monkeypatch.setattr(os, "rename", _exdev(os.rename, only_from_work=True))
    moved = inbox.finish(claim, "done")
    assert moved.read_bytes() == CSV
    assert not list((root / ".work").iterdir())
    assert sorted(p.name for p in (root / "done").iterdir()) == ["catalogue.csv"]


# -- folders removed, files gone, while the daemon runs ------------------------------------


class _VanishingLedger(MemoryClaimLedger):
    """A ledger whose recording of a claim takes long enough for something to be removed
    before the daemon moves the file."""

    def __init__(self, gone: Callable[[], None]) -> None:
        super().__init__()
        self._gone = gone

    def record_claim(self, record: ClaimRecord) -> None:
        super().record_claim(record)
        self._gone()


@pytest.mark.parametrize("gone", ["the file", "the work folder"])
def test_a_file_or_work_gone_between_the_hash_and_the_move(
    tmp_path: Path, gone: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer taking back a wrong drop (``rm``) or ``rm -rf inbox/.work`` between the
    hash and the move: FileNotFoundError out of the claim, exit 1 (for the folder, naming the
    manifest, which was there). A file gone is abandoned; ``.work`` is made again."""
    root = tmp_path / "inbox"
    root.mkdir()
    target = root / "m.csv"
    target.write_bytes(CSV)

    taken: list[bool] = []

    def take_back() -> None:
        if taken:
            return
        taken.append(True)
        if gone == "the file":
            target.unlink(missing_ok=True)
        else:
            shutil.rmtree(root / ".work", ignore_errors=True)

    inbox = _inbox(root, _VanishingLedger(take_back))
    [path] = inbox.scan()
    claim = inbox.claim(path)
    if gone == "the file":
        assert claim is None
        record = inbox.ledger.lookup("m.csv")
        assert record is not None and record.status == "abandoned"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        target.write_bytes(CSV)  # dropped again: claimed
        [path] = inbox.scan()
        assert inbox.claim(path) is not None
    else:
        assert claim is not None and Path(claim.path) == root / ".work" / "m.csv"
        assert Path(claim.path).read_bytes() == CSV


def test_a_bad_manifest_after_failed_was_removed(tmp_path: Path) -> None:
    """``rm -rf inbox/failed`` (the operator has read the failures) while the daemon runs:
    the next unreadable manifest's error file could not be written, and the daemon stopped
    with exit 1. The folders the daemon owns are made again when missing."""
    root = tmp_path / "inbox"
    inbox = _inbox(root)
    (root / "bad.csv").write_bytes(b"id,nourl\n1,2\n")
    [path] = inbox.scan()
    claim = inbox.claim(path)
    assert claim is not None
    shutil.rmtree(root / "failed")
    moved = inbox.fail(claim, "no url column")
    assert moved.exists() and moved.with_name(moved.name + ".error.json").exists()


class _Killed(BaseException):
    """kill -9 at that point: nothing after it runs, no handler cleans up."""


def test_a_copy_to_done_killed_before_its_source_was_removed_is_not_kept_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``done/`` on another file system, and the daemon killed between the copy's rename into
    place and the removal of ``.work/NAME``: at the restart the recovery copied it again, to
    ``done/NAME.<sha12>`` (two copies in done/). The copy in place holds the same bytes: the
    one in ``.work`` is removed."""
    root = tmp_path / "inbox"
    ledger = MemoryClaimLedger()
    inbox, claim = _claimed(root, ledger)
    monkeypatch.setattr(os, "rename", _exdev(os.rename, only_from_work=True))
    real_unlink = os.unlink

    def unlink(target: object) -> None:
        if "/.work/" in str(target):
            raise _Killed
        real_unlink(target)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "unlink", unlink)
        with pytest.raises(_Killed):
            inbox.finish(claim, "done")
    assert (root / ".work" / "catalogue.csv").exists()
    assert _inbox(root, ledger).recover() == []
    assert not list((root / ".work").iterdir())
    assert sorted(p.name for p in (root / "done").iterdir()) == ["catalogue.csv"]
    assert (root / "done" / "catalogue.csv").read_bytes() == CSV


def test_a_copy_to_done_killed_midway_leaves_no_temp_file_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon killed while it copied a settled manifest to ``done/`` on another file
    system: a hidden temp file of half the manifest is left in ``done/``. The restart
    finishes the move and leaves no temp file behind, even when the manifest goes to another
    name than the one the killed copy was for."""
    root = tmp_path / "inbox"
    ledger = MemoryClaimLedger()
    inbox, claim = _claimed(root, ledger)
    monkeypatch.setattr(os, "rename", _exdev(os.rename, only_from_work=True))
    real_copy, real_path_unlink = shutil.copyfileobj, Path.unlink

    def copy(src: object, dst: object, length: int = 0) -> None:
        dst.write(CSV[:10])  # type: ignore[attr-defined]
        dst.flush()  # type: ignore[attr-defined]
        raise _Killed

    def path_unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name.endswith(".tmp"):
            raise _Killed
        real_path_unlink(self, missing_ok=missing_ok)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shutil, "copyfileobj", copy)
        mp.setattr(Path, "unlink", path_unlink)
        with pytest.raises(_Killed):
            inbox.finish(claim, "done")
    assert [p.name for p in (root / "done").iterdir() if p.name.startswith(".")]
    (root / "done" / "catalogue.csv").write_bytes(b"another file of that name\n")
    assert real_copy is shutil.copyfileobj
    assert _inbox(root, ledger).recover() == []
    assert not list((root / ".work").iterdir())
    done = sorted(p.name for p in (root / "done").iterdir())
    assert [name for name in done if name.startswith(".")] == [], done
    assert len(done) == 2 and done[0] == "catalogue.csv", done
