"""``fashiontag daemon`` restarted with another ``--base-url`` (a unit file edited to a staging
URL or a new region) while manifests were in flight: their tasks are on the first service, and
the second does not know them.

Found by a hunt: the restarted daemon took every such task as forgotten and sent its rows, and
billed them, to the second service, while the first still tagged them. ``fashiontag run`` has
refused such a resume since the eighth session; the daemon did not. It now exits 2 at start-up
naming the service the tasks are on, and a URL that reaches the same service (a proxy, a new
name) resumes as before.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon.config import DEFAULT_STATE_NAME
from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service

from ..engine.proxy import Misbehaviour, misbehaving
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

N = 600


def _tasks_recorded(daemon: DaemonProcess) -> bool:
    """Whether the daemon's state holds a task (the create's answer committed). Killed once
    the service had the rows but before that (the answer in flight), the restart found no
    task to ask about: the test waited for an exit 2 that never came (1 run in 4 here)."""
    path = daemon.inbox / DEFAULT_STATE_NAME
    if not path.exists():
        return False
    state = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return state.execute("SELECT count(*) FROM tasks").fetchone()[0] > 0
    except sqlite3.OperationalError:  # (not made yet)
        return False
    finally:
        state.close()


async def _killed_with_rows_in_flight(
    daemon: DaemonProcess, first: RunningService, ids: list[str]
) -> None:
    """``ids`` dropped as a manifest, killed (SIGKILL) once every row is sent to ``first`` and
    the state holds their task, none read back yet."""
    await daemon.wait_ready_endpoint()
    drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
    with anyio.fail_after(30):
        while first.store.image_count < N or not _tasks_recorded(daemon):
            daemon.check_alive()
            await anyio.sleep(0.02)
    await daemon.kill()


@pytest.mark.parametrize("elsewhere", ["another service", "the same one by another name"])
async def test_a_daemon_restarted_on_another_service_bills_no_row_there(
    tmp_path: Path, elsewhere: str
) -> None:
    ids = [f"p{i}" for i in range(N)]
    async with (
        running_service(ServiceConfig(rate=300.0)) as first,
        running_service(ServiceConfig()) as other,
        misbehaving(first.url, Misbehaviour()) as proxy,
    ):
        daemon = DaemonProcess(tmp_path, first.url).start()
        try:
            await _killed_with_rows_in_flight(daemon, first, ids)
            url = other.url if elsewhere == "another service" else proxy.url
            daemon = DaemonProcess(tmp_path, url, port=daemon.port).start()
            if elsewhere == "another service":
                code = await daemon.wait_exit(timeout=30)
                log = daemon.tail()
                assert code == 2, log
                assert f"--base-url {first.url}" in log and "--restart" not in log, log
                assert other.store.image_count == 0  # nothing sent (billed) there
                daemon = DaemonProcess(tmp_path, first.url, port=daemon.port).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert summary["status"] == "done" and summary["tagged"] == N, summary
        assert first.store.image_count == N and other.store.image_count == 0
    lines = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert sorted(line["id"] for line in lines) == sorted(ids)


async def test_a_restart_on_a_service_that_does_not_answer_starts_within_seconds(
    tmp_path: Path,
) -> None:
    """Found in review: the start-up question was asked with the client's full retries, so a
    new --base-url answering 503 with ``Retry-After: 60`` (a maintenance page) kept the daemon
    from listening for minutes (systemd's TimeoutStartSec killed it, over and over): it is
    now bounded, as a service that cannot tell (the URL not recorded: the next start asks
    again)."""
    ids = [f"p{i}" for i in range(N)]
    async with (
        running_service(ServiceConfig(rate=300.0)) as first,
        running_service(ServiceConfig()) as other,
        misbehaving(other.url, Misbehaviour(storm=503, storm_retry_after="60")) as busy,
    ):
        daemon = DaemonProcess(tmp_path, first.url).start()
        try:
            await _killed_with_rows_in_flight(daemon, first, ids)
            daemon = DaemonProcess(tmp_path, busy.url, port=daemon.port).start()
            await daemon.wait_ready_endpoint(timeout=20)
            assert busy.storm_answers >= 1  # it was asked, and said nothing
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        assert other.store.image_count == 0
    state = sqlite3.connect(daemon.inbox / DEFAULT_STATE_NAME)
    try:
        (service,) = state.execute("SELECT value FROM meta WHERE key = 'service'").fetchone()
    finally:
        state.close()
    assert service == first.url.rstrip("/")  # not taken as the tasks' service
