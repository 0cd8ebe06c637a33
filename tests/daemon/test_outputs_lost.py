"""Outputs removed under a running daemon (a cleanup job, an operator tidying the outbox).

The rows written before are gone with the files, so the manifest cannot end ``done``; but the
daemon must not die over it (and die again on every restart): the manifest ends ``failed``
with a reason that says what happened and how to tag it again, and the daemon goes on with
the others.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, faults, running_service

from ..engine.helpers import short_deadline
from .helpers import DaemonProcess, drop_atomic, until_results, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


def _drop(inbox: Path, name: str, ids: list[str]) -> None:
    drop_atomic(inbox, name, write_manifest(Path(), ids))


def _assert_failed_for_lost_outputs(summary: dict[str, object]) -> None:
    assert summary["status"] == "failed", summary
    reason = str(summary["reason"])
    assert "removed" in reason and "tagged again" in reason, reason


def _take_away(daemon: DaemonProcess, removed: str) -> None:
    """The manifest's folder or the whole outbox removed (a cleanup job), or its results cut
    short (logrotate's ``copytruncate``: it ended ``done`` over a file starting with a hole of
    NUL bytes, its first lines only in the copy)."""
    if removed == "results-cut-short":
        results = daemon.outbox / "m" / "results.jsonl"
        shutil.copyfile(results, daemon.root / "rotated.jsonl")
        os.truncate(results, 0)
    else:
        shutil.rmtree(daemon.outbox / "m" if removed == "folder" else daemon.outbox)


@pytest.mark.parametrize("removed", ["folder", "outbox", "results-cut-short"])
@pytest.mark.parametrize("killed", [True, False], ids=["while-killed", "while-written"])
async def test_outputs_removed_fail_the_manifest_not_the_daemon(
    tmp_path: Path, removed: str, killed: bool
) -> None:
    ids = [f"a{i}" for i in range(8000)]
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m.csv", ids)
            await until_results(daemon, "m", 1000)
            if killed:
                await daemon.kill()
            _take_away(daemon, removed)
            if killed:
                daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port).start()
            summary = await daemon.wait_summary("m", timeout=90)
            _drop(daemon.inbox, "next.csv", ["n1", "n2", "n3"])
            after = await daemon.wait_summary("next", timeout=60)
            daemon.check_alive()
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    _assert_failed_for_lost_outputs(summary)
    if removed == "results-cut-short":
        assert "cut short" in str(summary["reason"])
    assert (daemon.inbox / "failed" / "m.csv").exists()
    assert after["status"] == "done" and after["tagged"] == 3


async def test_a_failed_manifest_still_sends_the_rows_it_took_in_before_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while rows were validated and counted but not yet in a chunk (a slow service),
    restarted with the folder removed: the job fails, but those rows are read again and sent
    (else they wait for their outcome for ever and the manifest never ends)."""
    slow = [8.0]
    monkeypatch.setattr(faults.FaultDice, "latency", lambda self: slow[0])
    lines = ["id,url,brand"] + [
        f"a{n},https://img.example/{n}.jpg,acme" if n % 10 else f"a{n},,acme" for n in range(8000)
    ]
    spec = faults.FaultSpec(latency=1.0, latency_seconds=1.0)
    async with running_service(ServiceConfig(rate=3000.0, faults=spec)) as svc:
        # (The restart looks for the creates killed on their way for the request deadline
        # after they were sent: 12 s here, above the service's 8 s, not the 30 s cap.)
        extra = list(short_deadline(tmp_path, 12.0))
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            tmp = daemon.inbox / ".m.csv.part"
            tmp.write_text("\n".join(lines) + "\n")
            os.rename(tmp, daemon.inbox / "m.csv")
            state = daemon.inbox / ".fashiontag-daemon.sqlite"
            with anyio.fail_after(60):  # rejects committed, rows taken in past the chunks
                while True:
                    daemon.check_alive()
                    with contextlib.suppress(sqlite3.Error):
                        with contextlib.closing(sqlite3.connect(state)) as db:
                            row = db.execute(
                                "SELECT validated, chunked, rejects_ckpt FROM jobs"
                            ).fetchone()
                        if row and row[0] > row[1] + 1000 and row[2] > 0:
                            break
                    await anyio.sleep(0.05)
            await daemon.kill()
            slow[0] = 0.0
            shutil.rmtree(daemon.outbox / "m")
            daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port, extra=extra).start()
            summary = await daemon.wait_summary("m", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    _assert_failed_for_lost_outputs(summary)
    assert (daemon.inbox / "failed" / "m.csv").exists()
