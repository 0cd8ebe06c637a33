"""Resource failures a long-lived daemon meets: a full disk, a file-descriptor limit.

A daemon whose disk is full or whose process is out of file descriptors may stop (its
supervisor restarts it); what it must not do is turn that moment into a lasting outcome:
a good manifest moved to ``failed/`` for ever, or its outputs put in another folder than
``OUTBOX/STEM`` once there is room again.

Each fault is injected in the real daemon process by a small bootstrap (``_BOOT``): the
error is the one the kernel gives at that moment (a real ``EMFILE``: the process's
descriptor table is filled before the call and emptied after it; ``ENOSPC`` as a full disk
answers a write into a file just created, which a tmpfs of a few KiB reproduces by hand). The
fault fires once, while its flag file exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/fd, rlimits")

_BOOT = r'''
import errno, os, resource, sys
from pathlib import Path

FAULT = os.environ.get("FT_FAULT", "")
FLAG = Path(os.environ.get("FT_FLAG", "/nonexistent"))
HIT = Path(os.environ.get("FT_HIT", "/nonexistent"))


def fire() -> bool:
    """Whether the fault fires now (once: the flag is removed)."""
    try:
        FLAG.unlink()
    except FileNotFoundError:
        return False
    HIT.write_text(FAULT)
    return True


def at_fd_limit(fn):
    """``fn`` called while every descriptor the process may open is taken (a real EMFILE)."""
    def wrapper(*args, **kwargs):
        if not fire():
            return fn(*args, **kwargs)
        taken = []
        try:
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            return fn(*args, **kwargs)
        finally:
            for fd in taken:
                os.close(fd)
    return wrapper


if FAULT in ("hash-emfile", "open-emfile"):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))

if FAULT == "hash-emfile":  # the inbox hashes a dropped manifest
    from fashiontag_pipeline.daemon import inbox
    inbox.hash_file = at_fd_limit(inbox.hash_file)

if FAULT == "open-emfile":  # the engine opens a claimed manifest (in .work) to read it
    from fashiontag_pipeline.engine import source
    real_open_manifest = source.open_manifest

    def open_manifest(path, *args, **kwargs):
        if "/.work/" in str(path):
            return at_fd_limit(real_open_manifest)(path, *args, **kwargs)
        return real_open_manifest(path, *args, **kwargs)

    source.open_manifest = open_manifest

if FAULT == "claim-enospc":  # the disk is full when the outbox folder's .claim is written
    from fashiontag_pipeline.daemon import outbox

    class _Os:
        def __getattr__(self, name):
            return getattr(os, name)

        def write(self, fd, data):
            if "/.claim" in os.readlink(f"/proc/self/fd/{fd}") and fire():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return os.write(fd, data)

    outbox.os = _Os()

from fashiontag_pipeline.cli import main

raise SystemExit(main(sys.argv[1:]))
'''


class FaultyDaemon(DaemonProcess):
    """The daemon started through ``_BOOT`` (same arguments), one fault armed."""

    def start(self) -> FaultyDaemon:
        boot = self.root / "boot.py"
        boot.write_text(_BOOT)
        real = subprocess.Popen

        def popen(args: list[str], *a: object, **k: object) -> subprocess.Popen[bytes]:
            at = args.index("-m")
            return real([*args[:at], str(boot), *args[at + 2 :]], *a, **k)  # type: ignore[call-overload, no-any-return]

        subprocess.Popen = popen  # type: ignore[assignment, misc]
        try:
            super().start()
        finally:
            subprocess.Popen = real  # type: ignore[misc]
        return self


def _armed(root: Path, fault: str) -> dict[str, str]:
    (root / "fault.flag").touch()
    return {
        "FT_FAULT": fault,
        "FT_FLAG": str(root / "fault.flag"),
        "FT_HIT": str(root / "fault.hit"),
    }


async def _until_fired(daemon: DaemonProcess, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not (daemon.root / "fault.hit").exists():
            daemon.check_alive()
            await anyio.sleep(0.02)


def _summaries(outbox: Path) -> dict[str, dict[str, object]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(outbox.glob("*/summary.json"))}


async def _until_settled(daemon: DaemonProcess, stem: str, timeout: float = 20.0) -> None:
    """Until a summary exists anywhere in the outbox, or the manifest lies in ``failed/``
    (the daemon is restarted, as its supervisor would, if it exited)."""
    with anyio.move_on_after(timeout):
        while not _summaries(daemon.outbox) and not (daemon.inbox / "failed" / stem).exists():
            assert daemon.proc is not None
            if daemon.proc.poll() is not None:
                daemon.start()
            await anyio.sleep(0.05)


@pytest.mark.parametrize("fault", ["hash-emfile", "open-emfile"])
async def test_a_manifest_met_at_the_descriptor_limit_is_tagged_not_failed(
    tmp_path: Path, fault: str
) -> None:
    """The daemon is out of file descriptors for a moment (its own sockets and files at
    ``LimitNOFILE``) just as it hashes a dropped manifest, or opens a claimed one to read it:
    ``open`` fails with EMFILE. That is the daemon's trouble, not the file's: the manifest
    must be tagged once descriptors are free again (the daemon may stop and be restarted).
    Before, it was taken for an unreadable file and moved to ``failed/`` for ever ("cannot be
    read: Too many open files"; with the open, a ``failed`` summary): its rows never tagged,
    and nothing tags them unless someone drops the file again."""
    ids = [f"a{i}" for i in range(50)]
    async with running_service(ServiceConfig()) as svc:
        daemon = FaultyDaemon(tmp_path, svc.url, env=_armed(tmp_path, fault)).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ids))
            await _until_fired(daemon)
            await _until_settled(daemon, "a.csv")
            summaries = _summaries(daemon.outbox)
            failed = sorted(p.name for p in (daemon.inbox / "failed").glob("*"))
            await daemon.stop()
        finally:
            daemon.ensure_dead()
        billed = svc.store.image_count
    assert not failed, (failed, summaries)
    assert summaries.get("a", {}).get("status") == "done", summaries
    results = read_lines(daemon.outbox / "a" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(ids)
    assert billed == len(ids)


async def test_a_full_disk_while_the_output_folder_is_marked_keeps_stem(tmp_path: Path) -> None:
    """The outbox's disk is full when the daemon takes ``OUTBOX/a`` for a new manifest: the
    folder is made and its ``.claim`` mark created, but the mark's bytes cannot be written
    (ENOSPC). The daemon stops (or fails the write); once there is room the manifest's
    outputs must be ``OUTBOX/a/results.jsonl`` and ``OUTBOX/a/summary.json`` (DESIGN 6: another
    folder only when STEM holds another content's outputs). Before, the empty mark made
    ``OUTBOX/a`` look like another claim's folder for ever: the outputs went to
    ``OUTBOX/a.<sha12>``, and a consumer waiting for ``OUTBOX/a/summary.json`` waits for
    ever beside an empty folder."""
    ids = [f"a{i}" for i in range(50)]
    async with running_service(ServiceConfig()) as svc:
        daemon = FaultyDaemon(tmp_path, svc.url, env=_armed(tmp_path, "claim-enospc")).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "a.csv", write_manifest(Path(), ids))
            await _until_fired(daemon)
            await _until_settled(daemon, "a.csv")
            summaries = _summaries(daemon.outbox)
            await daemon.stop()
        finally:
            daemon.ensure_dead()
        billed = svc.store.image_count
    assert list(summaries) == ["a"], (summaries, sorted(os.listdir(daemon.outbox)))
    assert summaries["a"]["status"] == "done" and summaries["a"]["tagged"] == len(ids)
    assert sorted(os.listdir(daemon.outbox)) == ["a"]
    # The daemon's error names the file it could not write (a bare "[Errno 28]" did not).
    logs = "".join(p.read_text() for p in daemon.root.glob("daemon-*.err"))
    full = [line for line in logs.splitlines() if "No space left" in line]
    assert full and all(".claim" in line for line in full), full
    results = read_lines(daemon.outbox / "a" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(ids)
    assert billed == len(ids)


def test_a_summary_that_cannot_be_written_names_its_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while the daemon writes summary.json (or a .error.json): the error named no
    file ("[Errno 28] No space left on device"), and a half-written temp file stayed."""
    import errno as errno_

    from fashiontag_pipeline.daemon import _files

    def full(fd: int) -> None:
        raise OSError(errno_.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files.os, "fsync", full)
    target = tmp_path / "summary.json"
    with pytest.raises(OSError, match="No space left") as info:
        _files.write_atomic(target, b"{}")
    assert info.value.filename == str(target) and str(target) in str(info.value)
    assert list(tmp_path.iterdir()) == []
