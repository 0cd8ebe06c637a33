"""The daemon used as real teams use it, beside the documented way: a SIGHUP, a second
daemon started on the same inbox by mistake, a restart with another ``--outbox``."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.lockkeep import TAKEN_LOOKS
from fashiontag_pipeline.daemon.room import WATCH_INTERVAL
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, read_lines, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


def _drop(inbox: Path, name: str, ids: list[str]) -> None:
    drop_atomic(inbox, name, write_manifest(Path(), ids))


async def test_a_sighup_is_ignored_not_a_silent_death(tmp_path: Path) -> None:
    """A closed terminal or a log rotation's ``kill -HUP`` killed the daemon with no drain
    and no line (systemd's Restart=on-failure takes that for a clean stop)."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            daemon.signal(signal.SIGHUP)
            await anyio.sleep(0.3)
            daemon.check_alive()
            _drop(daemon.inbox, "m.csv", ["a", "b", "c"])
            summary = await daemon.wait_summary("m")
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["tagged"] == 3
    assert any("SIGHUP" in line.get("event", "") for line in daemon.logs())


@pytest.mark.parametrize("cleanup", [False, True])
async def test_a_second_daemon_on_the_same_inbox_is_refused(tmp_path: Path, cleanup: bool) -> None:
    """Each given its own --state, two daemons on one inbox both resumed the manifests in
    flight and tagged them twice: the second is refused at start, naming the way to share.
    So after a cleanup of empty files in the inbox (``find INBOX -type f -empty -delete``),
    which took the inbox's lock file while it was empty (it holds a line now)."""
    async with running_service(ServiceConfig()) as svc:
        first = DaemonProcess(tmp_path, svc.url, extra=["--state", str(tmp_path / "a.db")])
        first.start()
        second = DaemonProcess(tmp_path, svc.url, extra=["--state", str(tmp_path / "b.db")])
        try:
            await first.wait_ready_endpoint()
            if cleanup:
                for path in first.inbox.rglob("*"):
                    if path.is_file() and path.stat().st_size == 0:
                        path.unlink()
            second.start()
            code = await second.wait_exit(timeout=30)
            first.check_alive()
            assert await first.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
    assert code != 0
    err = second.stderr_path.read_text()
    assert "watched by another daemon" in err and "PostgreSQL" in err


async def test_a_restart_with_another_outbox_ends_the_manifest_where_it_was_written(
    tmp_path: Path,
) -> None:
    """Stopped mid-manifest and restarted with another --outbox: its rows were written to the
    first outbox; its summary said done in a new, empty folder of the second. It now ends in
    the folder that holds its rows, every id once."""
    ids = [f"p{i}" for i in range(12_000)]
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "big.csv", ids)
            await until_results(daemon, "big", 1000)
            await daemon.kill()
            moved = tmp_path / "outbox2"
            daemon = DaemonProcess(
                tmp_path, svc.url, port=daemon.port, extra=["--outbox", str(moved)]
            ).start()
            summary = await daemon.wait_summary("big", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done"
    rows = read_lines(tmp_path / "outbox" / "big" / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert not (moved / "big").exists()


async def test_a_manifest_an_older_build_recorded_under_a_relative_outbox_is_not_another(
    tmp_path: Path,
) -> None:
    """Builds before 2026-11-27 14:55 recorded a manifest's outputs as given: under a relative
    ``--outbox`` (a daemon started in its folder), a relative path. Killed under such a build
    and restarted by this one with the same command line, every manifest it resumed was
    logged ``manifest resumed into its folder in another outbox (the daemon was restarted with
    another --outbox)``, a warning of a change nobody made (an operator hunting for the other
    outbox). The recorded folder is taken as the engine takes it, from the working directory."""
    ids = [f"p{i}" for i in range(12_000)]
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "big.csv", ids)
            await until_results(daemon, "big", 1000)
            await daemon.kill()
            state = daemon.inbox / ".fashiontag-daemon.sqlite"
            with sqlite3.connect(state) as db:  # the job as such a build recorded it
                db.execute(
                    "UPDATE jobs SET results = 'outbox/big/results.jsonl',"
                    " rejects = 'outbox/big/rejects.jsonl'"
                )
            daemon = DaemonProcess(
                tmp_path, svc.url, port=daemon.port, cwd=tmp_path, extra=["--outbox", "outbox"]
            ).start()
            summary = await daemon.wait_summary("big", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done"
    rows = read_lines(tmp_path / "outbox" / "big" / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(ids)
    warned = [e for e in daemon.logs() if "another outbox" in str(e.get("event"))]
    assert warned == []


async def test_a_manifest_removed_from_work_or_an_unwritable_done_stop_nothing(
    tmp_path: Path,
) -> None:
    """An operator removes a manifest from .work/ while it is in flight (its rows are read
    from the open file, and its outputs complete), and done/ is then replaced by a file (a
    folder the daemon cannot write): each move after the summary failed and stopped the
    daemon, at every start. The summaries are written; the daemon goes on."""
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m.csv", [f"p{i}" for i in range(6000)])
            claimed = daemon.inbox / ".work" / "m.csv"
            await until_results(
                daemon, "m", timeout=30
            )  # read by the engine: its first results are in
            claimed.unlink()
            first = await daemon.wait_summary("m", timeout=60)
            (daemon.inbox / "done").rmdir()
            (daemon.inbox / "done").write_bytes(b"not a folder")
            _drop(daemon.inbox, "n.csv", ["a", "b"])
            second = await daemon.wait_summary("n", timeout=60)
            await anyio.sleep(0.3)
            daemon.check_alive()
            assert await daemon.stop() == 0
            (daemon.inbox / "done").unlink()
            daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port).start()
            await daemon.wait_ready_endpoint()
            with anyio.fail_after(30):  # a start-up moves what it could not
                while not (daemon.inbox / "done" / "n.csv").exists():
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert first["status"] == "done" and first["tagged"] == 6000
    assert second["status"] == "done" and second["tagged"] == 2


async def test_a_manifest_moved_back_to_the_inbox_while_in_flight_waits_for_it(
    tmp_path: Path,
) -> None:
    """An operator moves a manifest in flight from .work/ back to the inbox (a "retry"): it
    was claimed again at once, its record replaced the first claim's, and when the first
    ended the daemon died on a claim no longer in flight. It now waits for the first claim
    to end, and is then its duplicate."""
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m.csv", [f"p{i}" for i in range(6000)])
            claimed = daemon.inbox / ".work" / "m.csv"
            await until_results(
                daemon, "m", timeout=30
            )  # read by the engine: its first results are in
            os.rename(claimed, daemon.inbox / "m.csv")
            first = await daemon.wait_summary("m", timeout=60)
            with anyio.fail_after(60):
                while not list(daemon.outbox.glob("m.*/summary.json")):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            await anyio.sleep(0.3)
            daemon.check_alive()
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    [second] = [json.loads(p.read_text()) for p in daemon.outbox.glob("m.*/summary.json")]
    assert first["status"] == "done" and first["tagged"] == 6000
    assert second["status"] == "duplicate"


#: ``HOOK_SIGNAL_AGAIN`` (SIGTERM or SIGINT, by number): once the daemon has logged "daemon
#: stopped", that signal is sent to it again at each point of its way out where the race was
#: lost: the log line itself, right after every change of SIGTERM's or SIGINT's handler (the
#: signal receiver giving back the default one while the event loop winds down), and last of
#: all at exit. Each one sent is counted in ``HOOK_SENT`` (a file).
SIGNAL_AGAIN_HOOK = textwrap.dedent(
    """
    import atexit, logging, os, signal
    if os.environ.get("HOOK_SIGNAL_AGAIN"):
        _again = int(os.environ["HOOK_SIGNAL_AGAIN"])
        _sent = os.environ["HOOK_SENT"]
        _stopped = []
        def _send(where):
            if _stopped:
                with open(_sent, "a") as out:
                    out.write(where + "\\n")
                os.kill(os.getpid(), _again)
        _signal = signal.signal
        def signal_then_again(signum, handler):
            previous = _signal(signum, handler)
            if signum in (signal.SIGTERM, signal.SIGINT):
                _send(f"handler of {signum}")
            return previous
        signal.signal = signal_then_again
        class _Cue(logging.Filter):
            def filter(self, record):
                if record.getMessage() == "daemon stopped":
                    _stopped.append(1)
                    _send("daemon stopped")
                return True
        logging.getLogger("fashiontag_pipeline.daemon").addFilter(_Cue())
        atexit.register(_send, "exit")  # registered first: runs last
    """
)


@pytest.mark.parametrize("again", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_a_second_signal_while_the_drained_daemon_exits_keeps_exit_0(
    tmp_path: Path, again: signal.Signals
) -> None:
    """A second SIGTERM (systemd's, a supervisor's) arriving within ~0.1 s after a drained
    daemon logged "daemon stopped" killed it by signal 15 (exit -15, a failure to systemd):
    the signal receiver gave the default handler back while the event loop wound down. The
    hook sends the signal again at each such point, on cue, never by timing."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SIGNAL_AGAIN_HOOK)
    sent = tmp_path / "sent.txt"
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "HOOK_SIGNAL_AGAIN": str(int(again)), "HOOK_SENT": str(sent)}
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, env=env).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m.csv", ["a", "b", "c"])
            summary = await daemon.wait_summary("m")
            code = await daemon.stop()
        finally:
            daemon.ensure_dead()
    points = sent.read_text().splitlines() if sent.exists() else []
    assert code == 0, f"exit {code} after signals again at {points}:\n{daemon.tail()}"
    assert summary["status"] == "done" and summary["tagged"] == 3
    assert points[0] == "daemon stopped" and points[-1] == "exit", points
    assert "Traceback" not in daemon.stderr_path.read_text()


#: A cleanup's ages: a month and a day.
_MONTH = 31 * 86400


def _lock_files(tmp_path: Path, inbox: Path) -> list[Path]:
    return [inbox / ".fashiontag-daemon.lock", tmp_path / "a.db.lock"]


async def _until(done: Callable[[], bool], timeout: float) -> None:
    """Until ``done`` (or ``timeout`` seconds: the assertions after say what did not come)."""
    with anyio.move_on_after(timeout):
        while not done():
            await anyio.sleep(0.05)


def _recent(path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return st.st_size > 0 and time.time() - st.st_mtime < 3600


@pytest.mark.parametrize("cleanup", ["by-age", "removed"])
@pytest.mark.parametrize("shared", ["inbox", "state"])
async def test_a_daemon_keeps_its_locks_for_weeks(
    tmp_path: Path, cleanup: str, shared: str
) -> None:
    """A daemon touched its locks (the inbox's and its state's) only when it started: after a
    month of uptime a retention cleanup (``find /data -mtime +30 -delete``) took them, or
    another cleanup removed them outright, and a second daemon on the same inbox or state (a
    cron ``@reboot`` line, a unit started twice) started beside it: rows billed twice. The
    daemon keeps them (touched, made again when removed): the second is refused as when they
    are in place."""
    async with running_service(ServiceConfig()) as svc:
        first = DaemonProcess(tmp_path, svc.url, extra=["--state", str(tmp_path / "a.db")])
        first.start()
        if shared == "inbox":
            second = DaemonProcess(tmp_path, svc.url, extra=["--state", str(tmp_path / "b.db")])
        else:
            (tmp_path / "other").mkdir()
            second = DaemonProcess(
                tmp_path / "other", svc.url, extra=["--state", str(tmp_path / "a.db")]
            )
        try:
            await first.wait_ready_endpoint()
            locks = _lock_files(tmp_path, first.inbox)
            assert all(_recent(path) for path in locks)
            if cleanup == "by-age":  # a month of uptime, then find -mtime +30 -delete
                month_ago = time.time() - _MONTH
                for path in locks:
                    os.utime(path, (month_ago, month_ago))
                await _until(lambda: all(_recent(path) for path in locks), 3 * WATCH_INTERVAL + 2)
                for path in locks:
                    if time.time() - path.stat().st_mtime > 30 * 86400:
                        path.unlink()
            else:
                for path in locks:
                    path.unlink()
                await _until(lambda: all(_recent(path) for path in locks), 3 * WATCH_INTERVAL + 2)
            second.start()
            code = await second.wait_exit(timeout=30)
            first.check_alive()
            assert await first.stop() == 0
        finally:
            first.ensure_dead()
            second.ensure_dead()
    assert code == 2
    err = second.stderr_path.read_text()
    if shared == "inbox":
        assert "watched by another daemon" in err and "PostgreSQL" in err
    else:
        assert "is in use by another run" in err and "a.db.lock" in err


async def test_a_daemon_whose_lock_another_process_took_drains(tmp_path: Path) -> None:
    """The inbox's lock file replaced by one another process holds (it came between a cleanup
    and the daemon's next look): the daemon says so as an error and drains, leaving the inbox
    to the other, rather than claiming beside it."""
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--state", str(tmp_path / "a.db")])
        daemon.start()
        theirs = -1
        try:
            await daemon.wait_ready_endpoint()
            aside = daemon.inbox / ".theirs.lock"
            theirs = os.open(aside, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(aside, daemon.inbox / ".fashiontag-daemon.lock")
            code = await daemon.wait_exit(timeout=(TAKEN_LOOKS + 3) * WATCH_INTERVAL + 10)
        finally:
            daemon.ensure_dead()
            if theirs >= 0:
                os.close(theirs)
    assert code == 0
    said = [line for line in daemon.logs() if line.get("level") == "error"]
    assert any("another process now holds" in line.get("event", "") for line in said), said
