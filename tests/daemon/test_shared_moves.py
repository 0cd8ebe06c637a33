"""The inbox's moves beside other daemons (a PostgreSQL state) when the file system says no: a
manifest the claim's hard link, the removal of its inbox name or of its marker is refused.
As with one daemon (``test_inbox_moves.py``), none may stop a daemon (its claim loop dies of
the exception, at every start), nor be said more than once by each daemon of the group."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.inbox import Inbox
from fashiontag_pipeline.daemon.leases import PostgresClaimLedger
from fashiontag_pipeline.daemon.ledger import ClaimRecord
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, write_manifest
from .test_inbox_moves import CSV, tag_beside_an_immovable_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="posix file semantics")


def _shared(root: Path, ledger: PostgresClaimLedger) -> Inbox:
    root.mkdir(exist_ok=True)
    inbox = Inbox(root, ledger=ledger, settle=0.0, clock=lambda: 1000.0, shared_after=30.0)
    inbox.prepare()
    return inbox


def _refuse(what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """EPERM where ``what`` says, for ``theirs.csv`` only: the claim's hard link (the kernel's
    protected_hardlinks and another account's file, an immutable file), the removal of its
    inbox name once linked (a sticky drop folder and another account's group-writable file),
    or the removal of its marker."""
    real_link, real_unlink, real_path_unlink = os.link, os.unlink, Path.unlink

    def link(src: object, dst: object) -> None:
        if str(src).endswith("/theirs.csv"):
            raise PermissionError(1, "Operation not permitted", str(src), None, str(dst))
        real_link(src, dst)  # type: ignore[arg-type]

    def unlink(path: object) -> None:
        if str(path).endswith("/theirs.csv") and "/.work/" not in str(path):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_unlink(path)  # type: ignore[arg-type]

    def path_unlink(self: Path, missing_ok: bool = False) -> None:
        if self.name == "theirs.csv.ready":
            raise PermissionError(1, "Operation not permitted", str(self))
        real_path_unlink(self, missing_ok=missing_ok)

    if what == "link":
        monkeypatch.setattr(os, "link", link)
    elif what == "unlink":
        monkeypatch.setattr(os, "unlink", unlink)
    else:
        monkeypatch.setattr(Path, "unlink", path_unlink)


@pytest.mark.parametrize("what", ["link", "unlink", "marker"])
def test_a_manifest_two_daemons_cannot_claim_is_left_alone_said_once_by_each(
    tmp_path: Path,
    postgres_url: str,
    what: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two daemons' inboxes on one folder and one database, scanning in turn: the refused
    step raised out of the claim (exit 1 at every start). Now the file is left in the inbox
    as it was (nothing of it in ``.work``, no claim recorded), each daemon says so once, even
    though each one's try touches the file (a link and its undoing set its ctime), and the
    next manifest is claimed; once the file is fixed (a chown: a new ctime), it is claimed."""
    ledgers = [PostgresClaimLedger(postgres_url, owner=o) for o in ("a", "b")]
    try:
        root = tmp_path / "inbox"
        inboxes = [_shared(root, ledger) for ledger in ledgers]
        (root / "theirs.csv").write_bytes(CSV)
        if what == "marker":
            (root / "theirs.csv.ready").touch()
        (root / "zz-ok.csv").write_bytes(CSV.replace(b"a.jpg", b"c.jpg"))
        _refuse(what, monkeypatch)
        claimed = []
        with caplog.at_level(logging.ERROR, "fashiontag_pipeline.daemon"):
            for _ in range(3):
                for inbox in inboxes:
                    for path in inbox.scan():
                        claim = inbox.claim(path)  # raised PermissionError before
                        if claim is not None:
                            claimed.append(claim.name)
        assert claimed == ["zz-ok.csv"]
        said = [r.getMessage() for r in caplog.records if "theirs.csv" in r.getMessage()]
        assert len(said) == 2, said  # once by each daemon
        assert all("cannot be claimed" in s and "Operation not permitted" in s for s in said)
        assert (root / "theirs.csv").read_bytes() == CSV
        assert not (root / ".work" / "theirs.csv").exists()
        assert ledgers[0].lookup("theirs.csv") is None
        assert [r.name for r in ledgers[0].in_flight()] == ["zz-ok.csv"]
        monkeypatch.undo()
        os.chmod(root / "theirs.csv", 0o600)  # the operator's fix (chown, chattr -i)
        [again] = inboxes[1].scan()
        claim = inboxes[1].claim(again)
        assert claim is not None and claim.name == "theirs.csv"
        assert not (root / "theirs.csv").exists()
    finally:
        for ledger in ledgers:
            ledger.close()


async def test_an_immovable_manifest_does_not_stop_a_shared_daemon(
    tmp_path: Path, postgres_url: str
) -> None:
    """A real daemon on a PostgreSQL state, a real EPERM: ``chattr +i`` refuses the claim's
    hard link even to root (as protected_hardlinks does another account's file). The daemon
    exited 1 at its first scan, and again at every start; ``ok.csv`` was never tagged."""
    await tag_beside_an_immovable_manifest(tmp_path, ["--state", postgres_url, "--lease", "2"])


# -- .work removed while the daemons run --------------------------------------------------


def test_work_removed_beside_other_daemons_is_made_again(
    tmp_path: Path, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``rm -rf inbox/.work`` (a cleanup job) while daemons share the inbox: the next repair
    (every lease) raised FileNotFoundError, which stopped the daemon with exit 1, and until
    then every claim's link failed in silence. ``.work`` is made again, said, and the next
    manifest claimed."""
    ledger = PostgresClaimLedger(postgres_url, owner="a")
    try:
        root = tmp_path / "inbox"
        inbox = _shared(root, ledger)
        shutil.rmtree(root / ".work")
        with caplog.at_level(logging.WARNING, "fashiontag_pipeline.daemon"):
            inbox.repair_shared()  # raised FileNotFoundError
        assert (root / ".work").is_dir()
        assert any(".work was gone" in r.getMessage() for r in caplog.records)
        shutil.rmtree(root / ".work")
        (root / "m.csv").write_bytes(CSV)
        [path] = inbox.scan()
        claim = inbox.claim(path)  # None before, at every scan
        assert claim is not None and Path(claim.path) == root / ".work" / "m.csv"
        assert [r.name for r in ledger.in_flight()] == ["m.csv"]
    finally:
        ledger.close()


async def test_a_shared_daemon_goes_on_after_work_was_removed(
    tmp_path: Path, postgres_url: str
) -> None:
    """The same with a real daemon on a PostgreSQL state: it exited 1 at its next repair."""
    async with running_service(ServiceConfig()) as svc:
        extra = ["--state", postgres_url, "--lease", "1"]
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            shutil.rmtree(daemon.inbox / ".work")
            await anyio.sleep(2.5)  # two repairs
            daemon.check_alive()
            drop_atomic(daemon.inbox, "ok.csv", write_manifest(Path(), ["c", "d"]))
            summary = await daemon.wait_summary("ok", timeout=30)
            assert summary["status"] == "done" and summary["tagged"] == 2
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()


def test_a_settled_file_that_cannot_leave_work_is_said_once_by_each_daemon(
    tmp_path: Path, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A settled manifest stuck in ``.work`` beside other daemons (its move into ``done/``
    refused, at every try): each daemon logged `cannot move ...` at every repair (every
    --lease, 30 s). It is said once, and once more when it moves at last."""
    ledger = PostgresClaimLedger(postgres_url, owner="a")
    try:
        root = tmp_path / "inbox"
        root.mkdir()
        inbox = Inbox(root, ledger=ledger, shared_after=0.0)
        inbox.prepare()
        (inbox.work / "stuck.csv").write_bytes(CSV)
        sha = hashlib.sha256(CSV).hexdigest()
        ledger.record_claim(ClaimRecord(name="stuck.csv", sha256=sha, size=len(CSV), claimed_at=1))
        ledger.record_settled("stuck.csv", "done", "done/stuck.csv")
        real_rename = os.rename

        def rename(src: object, dst: object) -> None:
            if str(src).endswith("/.work/stuck.csv"):
                raise PermissionError(13, "Permission denied", str(src), None, str(dst))
            real_rename(src, dst)  # type: ignore[arg-type]

        with caplog.at_level(logging.INFO, "fashiontag_pipeline.daemon"):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(os, "rename", rename)
                for _ in range(4):  # four repairs: two minutes at the default --lease
                    inbox.repair_shared()
            assert (inbox.work / "stuck.csv").exists()
            said = [r for r in caplog.records if "stuck.csv" in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.ERROR, said
            inbox.repair_shared()
            inbox.repair_shared()
        assert (inbox.done / "stuck.csv").read_bytes() == CSV
        said = [r.getMessage() for r in caplog.records if "stuck.csv" in r.getMessage()]
        assert len(said) == 2 and "left .work" in said[1], said
    finally:
        ledger.close()
