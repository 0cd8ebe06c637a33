"""A daemon paused past its lease, woken after another daemon finished its manifest.

The paused daemon (SIGSTOP, a stalled VM) had leased the manifest and was on its way to tag it
when it stopped; meanwhile another daemon leased it (epoch + 1), tagged it, wrote its summary
(``done``) and moved it to ``done/``. Woken, the paused daemon must write nothing the
consumers read: not a summary of its own over the finished one (a ``failed`` one makes an
operator drop the manifest again, and every row is tagged and billed twice), not an error file
in ``failed/``.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import anyio
import psycopg
import pytest

import fashiontag_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.helpers import short_deadline
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")

#: Loaded by a daemon at start (``sitecustomize``): ``HOOK_STOP=before|after`` stops the
#: process (SIGSTOP) once, before or after its first look for an earlier completion of a
#: manifest's content (``find_completed``), a moment between leasing a manifest and tagging it
#: (``before-broken``: woken, the look fails as on a connection the server closed meanwhile);
#: ``HOOK_STOP=opened`` once it has opened the manifest's state, before it reads it.
HOOK = textwrap.dedent(
    """
    import os, signal
    where = os.environ.get("HOOK_STOP")
    if where == "opened":
        from fashiontag_pipeline.engine.state import pgstore
        _init = pgstore.PostgresStateDB.__init__
        opened = []
        def init(self, *args, **kwargs):
            _init(self, *args, **kwargs)
            if not opened:
                opened.append(1)
                os.kill(os.getpid(), signal.SIGSTOP)
        pgstore.PostgresStateDB.__init__ = init
    elif where:
        from fashiontag_pipeline.daemon import leases
        cls = leases.PostgresClaimLedger
        _find = cls.find_completed
        done = []
        def find_completed(self, sha256):
            if where.startswith("before") and not done:
                done.append(1)
                os.kill(os.getpid(), signal.SIGSTOP)
                if where == "before-broken":  # its connection closed by the server meanwhile
                    import psycopg
                    with self._transaction("look up a completed manifest"):
                        raise psycopg.OperationalError("server closed the connection")
            found = _find(self, sha256)
            if where == "after" and not done:
                done.append(1)
                os.kill(os.getpid(), signal.SIGSTOP)
            return found
        cls.find_completed = find_completed
    """
)


def _path(hook: Path) -> str:
    """The hook's folder, then the package under test's: ``sitecustomize`` runs before
    ``-m`` puts the working folder on the path, so the hook would import whichever copy of
    the package is installed."""
    return os.pathsep.join([str(hook), str(Path(fashiontag_pipeline.__file__).parents[1])])


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0] == "T"


#: The daemons' flags: one PostgreSQL state, a short lease (the taker comes in 2 s), and a
#: short resume look for a create A had written ahead and not had answered (until a request's
#: deadline, here 3 s, has gone by since it was sent; list_lag 0.5 s: the reference service
#: lists a task as soon as it is created).
def _common(postgres_url: str, tmp_path: Path) -> list[str]:
    return ["--state", postgres_url, "--lease", "2", "--max-active", "2", *short_deadline(tmp_path)]


def _hooked(tmp_path: Path, url: str, postgres_url: str, hook: str, **env: str) -> DaemonProcess:
    """Daemon A, started with ``hook`` as its ``sitecustomize`` and ``env`` arming it."""
    folder = tmp_path / "hook"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(hook)
    return DaemonProcess(
        tmp_path,
        url,
        extra=_common(postgres_url, tmp_path),
        env={"PYTHONPATH": _path(folder), **env},
    ).start()


async def _until_paused(a: DaemonProcess) -> None:
    """Until the hook has stopped ``a`` (SIGSTOP)."""
    assert a.proc is not None
    with anyio.fail_after(30):
        while not _stopped(a.proc.pid):
            a.check_alive()
            await anyio.sleep(0.02)


async def _woken_until_lease_lost(a: DaemonProcess, settle: float) -> None:
    """Wake ``a`` (SIGCONT), until it logs its lease lost; then ``settle`` seconds more, for
    whatever it would still do."""
    a.signal(signal.SIGCONT)
    lost = "lease lost: another daemon finishes the manifest"
    # Not a resume of the manifest (the taker finished it), nor an error of it: the taker's
    # drop of its state, met before the keeper noticed the loss, is the loss's.
    stopped = "the manifest stopped on an error; it resumes when it is leased again"
    with anyio.fail_after(30):
        while lost not in (events := [line.get("event") for line in a.logs()]):
            assert stopped not in events, a.tail()
            a.check_alive()
            await anyio.sleep(0.05)
    await anyio.sleep(settle)


def _ensure_dead(a: DaemonProcess, b: DaemonProcess | None) -> None:
    """A test that failed midway: ``a`` woken (a stopped process ignores SIGTERM) and both
    reaped."""
    if a.proc is not None and a.proc.poll() is None:
        a.signal(signal.SIGCONT)
    a.ensure_dead()
    if b is not None:
        b.ensure_dead()


def _no_states(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM states").fetchone() == (0,)


async def _paused_then_woken(
    tmp_path: Path, postgres_url: str, where: str, *, dropped: bool = False
) -> Path:
    """Daemon A stops ``where`` it looks for an earlier completion of ``m.csv``; daemon B takes
    the manifest over and finishes it (``dropped``: and drops its state); A is woken and runs
    on until it says its lease is lost. Returns the manifest's output folder."""
    ids = [f"p{i}" for i in range(300)]
    async with running_service(ServiceConfig()) as svc:
        a = _hooked(tmp_path, svc.url, postgres_url, HOOK, HOOK_STOP=where)
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            a.inbox.mkdir(parents=True, exist_ok=True)
            drop_atomic(a.inbox, "m.csv", write_manifest(Path(), ids))
            await _until_paused(a)
            b = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path)).start()
            summary = await b.wait_summary("m", timeout=60)
            assert summary["status"] == "done"
            with anyio.fail_after(30):
                while not (a.inbox / "done" / "m.csv").exists() or (
                    dropped and not _no_states(postgres_url)
                ):
                    b.check_alive()
                    await anyio.sleep(0.02)
            await _woken_until_lease_lost(a, 0.5)
            assert await a.stop() == 0
            assert await b.stop() == 0
        finally:
            _ensure_dead(a, b)
    folder = tmp_path / "outbox" / "m"
    got = [r["id"] for r in read_lines(folder / "results.jsonl")]
    assert sorted(got) == sorted(ids)
    return folder


async def test_a_daemon_woken_past_its_lease_does_not_fail_the_finished_manifest(
    tmp_path: Path, postgres_url: str
) -> None:
    folder = await _paused_then_woken(tmp_path, postgres_url, "after")
    summary = (folder / "summary.json").read_text()
    assert '"status":"done"' in summary, summary
    assert not list((tmp_path / "inbox" / "failed").iterdir())


async def test_a_daemon_woken_past_its_lease_meeting_the_dropped_state_says_the_lease_lost(
    tmp_path: Path, postgres_url: str
) -> None:
    # A stops with the manifest's state opened; B finishes the manifest and drops the state.
    # Woken, A reads a state that is gone: its lease is lost, not the manifest stopped on an
    # error that resumes (it never does: it is done), an attempt of it counted.
    folder = await _paused_then_woken(tmp_path, postgres_url, "opened", dropped=True)
    summary = (folder / "summary.json").read_text()
    assert '"status":"done"' in summary, summary
    assert not list((tmp_path / "inbox" / "failed").iterdir())


async def test_a_daemon_woken_past_its_lease_does_not_call_the_manifest_its_own_duplicate(
    tmp_path: Path, postgres_url: str
) -> None:
    folder = await _paused_then_woken(tmp_path, postgres_url, "before")
    summary = (folder / "summary.json").read_text()
    assert '"status":"done"' in summary, summary


async def test_a_daemon_woken_past_its_lease_to_a_closed_connection_says_the_lease_lost(
    tmp_path: Path, postgres_url: str
) -> None:
    # Paused past its lease (its connections' transactions ended by the server meanwhile), A
    # is woken to a connection the server closed: its look for an earlier completion failed
    # before its keeper noticed the loss, and A said the manifest stopped on an error, an
    # attempt counted (under load, the test above now and then).
    folder = await _paused_then_woken(tmp_path, postgres_url, "before-broken")
    summary = (folder / "summary.json").read_text()
    assert '"status":"done"' in summary, summary


#: ``HOOK_STOP_IN_DROP``: the process stops (SIGSTOP) once, inside the transaction that drops a
#: settled manifest's state, right after its ``DROP SCHEMA`` (its tables locked until it ends).
DROP_HOOK = textwrap.dedent(
    """
    import os, signal
    if os.environ.get("HOOK_STOP_IN_DROP"):
        import psycopg
        _execute = psycopg.Connection.execute
        done = []
        def execute(self, query, *args, **kwargs):
            cursor = _execute(self, query, *args, **kwargs)
            text = query.as_string(self) if hasattr(query, "as_string") else str(query)
            if "DROP SCHEMA" in text and not done:
                done.append(1)
                os.kill(os.getpid(), signal.SIGSTOP)
            return cursor
        psycopg.Connection.execute = execute
    """
)


async def test_a_daemon_paused_while_dropping_a_state_does_not_hold_up_the_others(
    tmp_path: Path, postgres_url: str
) -> None:
    # Daemon A settles a manifest and stops (SIGSTOP: a stalled VM) in the middle of dropping
    # its state. Daemon B, started then, drops the states of settled manifests first thing: it
    # must not wait for A's transaction for ever (it never answered, never tagged).
    async with running_service(ServiceConfig()) as svc:
        a = _hooked(tmp_path, svc.url, postgres_url, DROP_HOOK, HOOK_STOP_IN_DROP="1")
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            drop_atomic(a.inbox, "m.csv", write_manifest(Path(), [f"m{i}" for i in range(50)]))
            await _until_paused(a)
            b = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path)).start()
            await b.wait_ready_endpoint(timeout=20)
            drop_atomic(a.inbox, "n.csv", write_manifest(Path(), [f"n{i}" for i in range(50)]))
            summary = await b.wait_summary("n", timeout=30)
            assert summary["status"] == "done"
            a.signal(signal.SIGCONT)
            assert await b.stop() == 0
            assert await a.stop() == 0
        finally:
            _ensure_dead(a, b)


#: ``HOOK_STOP_BEFORE_CREATE``: the process stops (SIGSTOP) once, right before it sends its
#: first create (the chunk is written ahead in the state: its fate is the taker's to settle).
CREATE_HOOK = textwrap.dedent(
    """
    import os, signal
    if os.environ.get("HOOK_STOP_BEFORE_CREATE"):
        from fashiontag_pipeline._client import TaggerClient
        _create = TaggerClient.create_task
        done = []
        async def create_task(self, *args, **kwargs):
            if not done:
                done.append(1)
                os.kill(os.getpid(), signal.SIGSTOP)
            return await _create(self, *args, **kwargs)
        TaggerClient.create_task = create_task
    """
)


async def test_a_daemon_woken_past_its_lease_sends_no_rows_the_taker_sent(
    tmp_path: Path, postgres_url: str
) -> None:
    # Daemon A stops right before it sends a chunk it wrote ahead; B takes the manifest over,
    # finds no task carrying the chunk's token and sends its rows itself, to the end. Woken, A
    # must not send them again: the service would tag (and bill) every row of it twice.
    ids = [f"c{i}" for i in range(300)]
    async with running_service(ServiceConfig()) as svc:
        a = _hooked(tmp_path, svc.url, postgres_url, CREATE_HOOK, HOOK_STOP_BEFORE_CREATE="1")
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            drop_atomic(a.inbox, "m.csv", write_manifest(Path(), ids))
            await _until_paused(a)
            b = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path)).start()
            summary = await b.wait_summary("m", timeout=60)
            await _woken_until_lease_lost(a, 1.0)
            assert await a.stop() == 0
            assert await b.stop() == 0
        finally:
            _ensure_dead(a, b)
        sent = [i for record in svc.store.tasks.values() for i in record.ids]
    assert summary["status"] == "done" and summary["tagged"] == len(ids)
    assert len(sent) == len(set(sent)), f"{len(sent) - len(set(sent))} rows were sent twice"
