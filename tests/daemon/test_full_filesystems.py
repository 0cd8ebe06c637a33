"""The daemon on real file systems that fill up: the outbox or the inbox (and the state file
beside it) on a tmpfs of its own (a second file system: EXDEV between inbox and outbox), filled
to the last page by a filler file, then given room again by removing the filler.

The daemon may stop on a full disk (exit 1; its supervisor restarts it); what it must do is
say which file could not be written, and once there is room, finish every manifest exactly
once: every row in the results, none twice, none billed twice. Skipped unless root (mount).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, daemon_once, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root"
)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path, leave_pages: int = 0) -> Path:
    """A filler file taking all of ``folder``'s file system but ``leave_pages`` pages."""
    st = os.statvfs(folder)
    filler = folder / ".filler"
    filler.write_bytes(b"x" * max(0, st.f_bavail * st.f_frsize - leave_pages * st.f_frsize))
    return filler


async def _until_exit_or_summary(daemon: DaemonProcess, stem: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not (daemon.outbox / stem / "summary.json").exists():
            assert daemon.proc is not None
            if daemon.proc.poll() is not None:
                return
            await anyio.sleep(0.05)


async def _finish_after_room(daemon: DaemonProcess, filler: Path, stem: str) -> dict[str, object]:
    """Room again (the filler removed): the daemon restarted if it stopped, until ``stem``'s
    summary exists. That summary."""
    filler.unlink()
    assert daemon.proc is not None
    if daemon.proc.poll() is not None:
        daemon.start()
    summary = await daemon.wait_summary(stem, timeout=30)
    assert await daemon.stop() == 0, daemon.tail()
    return summary


def _stopped_line(daemon: DaemonProcess) -> str:
    logs = "".join(p.read_text() for p in daemon.root.glob("daemon-*.err"))
    lines = [line for line in logs.splitlines() if "daemon stopped on an error" in line]
    assert lines, logs[-3000:]
    return str(json.loads(lines[0])["error"])


async def test_an_outbox_on_another_full_file_system_stops_then_finishes_exactly_once(
    tmp_path: Path,
) -> None:
    """The outbox is its own file system, full while a 2,000-row manifest's results are
    written: the daemon stops naming results.jsonl; with room again it finishes every row
    once, with a ``done`` summary, and the manifest moves to ``done/``."""
    ids = [f"a{i}" for i in range(2000)]
    with _tmpfs(tmp_path / "outbox", "8m") as outbox:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                filler = _fill(outbox, leave_pages=4)
                drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ids))
                await _until_exit_or_summary(daemon, "a")
                assert await daemon.wait_exit() == 1, daemon.tail()
                stopped = _stopped_line(daemon)
                assert "No space left" in stopped and "results.jsonl" in stopped, stopped
                summary = await _finish_after_room(daemon, filler, "a")
            finally:
                daemon.ensure_dead()
            billed = svc.store.image_count
        results = read_lines(outbox / "a" / "results.jsonl")
        assert summary["status"] == "done" and summary["tagged"] == len(ids), summary
        assert sorted(r["id"] for r in results) == sorted(ids)
        assert billed == len(ids)
        assert (daemon.inbox / "done" / "a.csv").exists()


async def test_a_state_file_on_a_full_file_system_is_named_then_finishes_exactly_once(
    tmp_path: Path,
) -> None:
    """The inbox (and the state file in it, the default) on a full file system when a
    manifest is dropped: SQLite cannot record the claim. The daemon stopped with exit 1 on
    "OperationalError: database or disk is full": which database, which disk? (the
    outbox's? the reuse store's?) The line names the state file; with room again, the manifest
    is tagged once."""
    ids = [f"a{i}" for i in range(10)]
    with _tmpfs(tmp_path / "inbox") as inbox:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                filler = _fill(inbox, leave_pages=1)
                drop_atomic(inbox, "a.csv", write_manifest(Path(), ids))
                await _until_exit_or_summary(daemon, "a")
                assert await daemon.wait_exit() == 1, daemon.tail()
                stopped = _stopped_line(daemon)
                assert "full" in stopped, stopped
                assert str(inbox / ".fashiontag-daemon.sqlite") in stopped, stopped
                summary = await _finish_after_room(daemon, filler, "a")
            finally:
                daemon.ensure_dead()
            billed = svc.store.image_count
        results = read_lines(daemon.outbox / "a" / "results.jsonl")
        assert summary["status"] == "done" and summary["tagged"] == len(ids), summary
        assert sorted(r["id"] for r in results) == sorted(ids)
        assert billed == len(ids)


async def _readyz_until(daemon: DaemonProcess, ready: bool, timeout: float = 15) -> str:
    """The body of ``/readyz`` once its status says ``ready`` (the last body at the timeout)."""
    body = ""
    with anyio.move_on_after(timeout):
        while True:
            status, body = await daemon.get("/readyz")
            if (status == 200) == ready:
                return body
            await anyio.sleep(0.1)
    raise AssertionError(f"/readyz never said ready={ready}: {body}")


async def test_readyz_says_an_idle_daemons_state_file_has_no_room(tmp_path: Path) -> None:
    """An idle daemon whose state file's file system fills up: the next manifest dropped will
    stop it (exit 1, the claim cannot be recorded), yet ``/readyz`` said 200 for as long as
    none came: a load balancer or an operator's check saw a daemon ready that could not take
    a single manifest (DESIGN 6: 200 when the state store is writable). It says 503 naming
    the state file, and 200 again once there is room."""
    with _tmpfs(tmp_path / "inbox") as inbox:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                await _readyz_until(daemon, ready=True)
                filler = _fill(inbox)
                body = await _readyz_until(daemon, ready=False)
                assert "state store not writable" in body, body
                assert str(inbox / ".fashiontag-daemon.sqlite") in body, body
                filler.unlink()
                await _readyz_until(daemon, ready=True)
                drop_atomic(inbox, "a.csv", write_manifest(Path(), ["a1", "a2"]))
                summary = await daemon.wait_summary("a")
                assert summary["status"] == "done", summary
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()


def test_a_state_file_on_a_read_only_mount_is_said_not_writable(tmp_path: Path) -> None:
    """What ``/readyz`` is told of a state file whose folder went read-only (a remount after
    an I/O error): not writable, the file named; then writable again."""
    from fashiontag_pipeline.daemon.room import state_file_problem

    folder = tmp_path / "state"
    folder.mkdir()
    state = folder / "daemon.sqlite"
    state.write_bytes(b"")
    assert state_file_problem(state) is None
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
        problem = state_file_problem(state)
    finally:
        subprocess.run(["umount", str(folder)], check=False)
    assert problem is not None and str(state) in problem and "read-only" in problem, problem
    assert state_file_problem(state) is None


async def test_a_file_that_cannot_be_claimed_is_copied_to_failed_on_another_file_system(
    tmp_path: Path,
) -> None:
    """``failed/`` a mount of its own (operators keep the failures on another volume; the
    page promises such a folder "gets a copy"): a manifest whose name is not UTF-8 was to go
    to ``failed/`` beside its reason at once, but its rename gave EXDEV, and it stayed in the
    inbox untagged, its only word "cannot be moved to failed/: Invalid cross-device link". It
    is copied there, beside its reason, and the manifest dropped after it is tagged."""
    with _tmpfs(tmp_path / "inbox" / "failed") as failed:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                drop_atomic(daemon.inbox, os.fsdecode(b"caf\xe9.csv"), b"id,url\n1,x\n")
                drop_atomic(daemon.inbox, "ok.csv", write_manifest(Path(), ["a", "b"]))
                summary = await daemon.wait_summary("ok")
                with anyio.fail_after(10):
                    while not (failed / "caf\\xe9.csv").exists():
                        await anyio.sleep(0.05)
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
        assert summary["status"] == "done", summary
        assert (failed / "caf\\xe9.csv").read_bytes() == b"id,url\n1,x\n"
        reason = json.loads((failed / "caf\\xe9.csv.error.json").read_text())["reason"]
        assert "not UTF-8" in reason, reason
        assert not (daemon.inbox / os.fsdecode(b"caf\xe9.csv")).exists()
        assert not [p for p in failed.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("how", ["mount", "symlink"])
def test_a_work_folder_on_another_file_system_is_refused_at_start(tmp_path: Path, how: str) -> None:
    """``INBOX/.work`` on a disk of its own (a mount there, or a symlink to a folder on a fast
    disk): a claim is a rename into it, which gave EXDEV for every manifest. The daemon
    started, ``/readyz`` said ready, and it tagged nothing, each manifest left in the inbox
    "until it changes or the daemon restarts" (a restart did not help). It is refused at
    start, exit 2, one line naming the folder."""
    inbox = tmp_path / "IN"
    inbox.mkdir()
    with _tmpfs(tmp_path / ("IN/.work" if how == "mount" else "fast")) as elsewhere:
        if how == "symlink":
            (inbox / ".work").symlink_to(elsewhere)
        proc, _ = daemon_once(tmp_path, "--base-url", "http://127.0.0.1:9")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"{inbox / '.work'}" in err and "another file system" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


async def test_a_full_failed_folder_does_not_stop_the_daemon(tmp_path: Path) -> None:
    """``failed/`` on a small volume of its own, full (or not writable) when a manifest fails:
    its ``NAME.error.json`` could not be written, the daemon stopped (exit 1), and at every
    start it took that manifest up again and stopped again, so a good manifest dropped beside
    it was never tagged. A folder it cannot write is never a reason to stop: the failed one is
    settled (its summary says why) and stays in ``.work`` until there is room, then moves to
    ``failed/`` beside an error file; the good one is tagged meanwhile, each once."""
    with _tmpfs(tmp_path / "inbox" / "failed", "1m") as failed:
        async with running_service(ServiceConfig()) as svc:
            daemon = DaemonProcess(tmp_path, svc.url).start()
            try:
                await daemon.wait_ready_endpoint()
                filler = _fill(failed)
                drop_atomic(daemon.inbox, "bad.csv", b"\x00\x01 no header\n")
                bad = await daemon.wait_summary("bad")
                drop_atomic(daemon.inbox, "ok.csv", write_manifest(Path(), ["a", "b"]))
                ok = await daemon.wait_summary("ok")
                assert (daemon.inbox / ".work" / "bad.csv").exists()
                assert await daemon.stop() == 0, daemon.tail()
                filler.unlink()
                daemon.start()
                with anyio.fail_after(20):
                    while not (failed / "bad.csv").exists():
                        daemon.check_alive()
                        await anyio.sleep(0.05)
                assert await daemon.stop() == 0, daemon.tail()
            finally:
                daemon.ensure_dead()
            billed = svc.store.image_count
        assert bad["status"] == "failed" and ok["status"] == "done", (bad, ok)
        assert json.loads((daemon.outbox / "bad" / "summary.json").read_text()) == bad
        assert json.loads((failed / "bad.csv.error.json").read_text())["sha256"] == bad["sha256"]
        assert not list((daemon.inbox / ".work").iterdir())
        assert sorted(r["id"] for r in read_lines(daemon.outbox / "ok" / "results.jsonl")) == [
            "a",
            "b",
        ]
        assert billed == 2


@contextlib.contextmanager
def _bound(source: Path, path: Path) -> Iterator[Path]:
    """``source`` bind-mounted at ``path``: the same file system (the same st_dev) under
    another mount, which no rename crosses (EXDEV)."""
    source.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "--bind", str(source), str(path)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount: {made.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_work_folder_bind_mounted_from_the_same_disk_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """``INBOX/.work`` a bind mount of a folder of the inbox's own disk (a container's two
    volumes from one host disk, a Kubernetes volume mounted twice by subPath): the same
    st_dev, so the start's check let it by, yet a rename into another mount gives EXDEV:
    ``/readyz`` said ready and every manifest stayed in the inbox, untagged. It is refused at
    start, exit 2, one line naming the folder; the check leaves nothing behind."""
    inbox = tmp_path / "IN"
    inbox.mkdir()
    with _bound(tmp_path / "volume", inbox / ".work"):
        try:
            proc, _ = daemon_once(tmp_path, "--base-url", "http://127.0.0.1:9")
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon started on a .work no claim can be renamed into")
        assert not list((inbox / ".work").iterdir())
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"{inbox / '.work'}" in err and "another" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in inbox.iterdir()) == [".work"]
