"""The inbox's moves when the file system says no: a manifest (or its marker) the daemon
cannot move, folders removed while it runs, a settled manifest that cannot leave ``.work``,
a file gone or replaced between its hash and its move. None of them may stop the daemon
(its claim loop dies of an exception, at every start), nor hold a name back in silence."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fashiontag_pipeline.daemon.inbox import Inbox
from fashiontag_pipeline.daemon.ledger import MemoryClaimLedger
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
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url)
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
        finally:
            daemon.ensure_dead()
            _chattr("-i", stuck)
