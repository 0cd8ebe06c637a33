"""``fashiontag daemon`` lives for weeks: what a manifest leaves in the state once its
summary is written must not grow with every manifest ever taken."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import Misbehaviour, misbehaving
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


async def test_rows_refused_by_the_service_do_not_stay_pending_for_reuse(tmp_path: Path) -> None:
    """With ``--reuse``, every row sent is kept in ``reuse_pending`` until its results page
    is committed; rows that end as rejects "stay until the next run of the state starts (it is
    emptied)" (``reuse_rows``). A daemon's state never starts a new run (it opens the result
    store as resumed, for ever), and its ids are ``JOB/ID``, never sent again: every row the
    service ever refused stays in the state file for the daemon's whole life. After three
    manifests, each with one row the service refuses, are complete (summaries written, the
    daemon stopped cleanly), nothing is pending."""
    store = tmp_path / "reuse.db"
    state = tmp_path / "state.db"
    rules = Misbehaviour(always_refused={"p3"})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        daemon = DaemonProcess(
            tmp_path, proxy.url, extra=["--reuse", str(store), "--state", str(state)]
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            for n in range(3):
                ids = [f"p{i}" for i in range(40)]
                drop_atomic(daemon.inbox, f"m{n}.csv", write_manifest(Path(), ids, url_tag=f"{n}-"))
                summary = await daemon.wait_summary(f"m{n}")
                assert summary["status"] == "done" and summary["rejected"] == 1
            assert await daemon.stop() == 0
        finally:
            if daemon.proc and daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGKILL)
    for n in range(3):
        rejects = read_lines(daemon.outbox / f"m{n}" / "rejects.jsonl")
        assert [(r["id"], r["stage"]) for r in rejects] == [("p3", "server-validation")]
    sql = sqlite3.connect(state)
    try:
        pending = sql.execute("SELECT id FROM reuse_pending ORDER BY id").fetchall()
    finally:
        sql.close()
    assert pending == [], f"rows of complete manifests still pending in the state: {pending}"
