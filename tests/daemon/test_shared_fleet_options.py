"""A fleet of daemons on one PostgreSQL state where one daemon was started with other options
than the others.

* another ``--outbox``: a manifest it took over from a daemon of the fleet found none of the
  committed rows in its own outbox, stopped at each attempt, and went to ``failed/`` after
  five, its rows hidden in the first outbox (dropped again, every row billed again).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.helpers import short_deadline
from .helpers import DaemonProcess, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")


def _drop(inbox: Path, name: str, ids: list[str]) -> None:
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{name}.part"
    tmp.write_bytes(write_manifest(Path(), ids))
    os.rename(tmp, inbox / name)


def _common(url: str, tmp_path: Path) -> list[str]:
    return ["--state", url, "--lease", "1", "--max-active", "2", *short_deadline(tmp_path)]


async def test_a_manifest_taken_over_by_a_daemon_with_another_outbox_ends_with_its_rows(
    tmp_path: Path, postgres_url: str
) -> None:
    ids = [f"k{i}" for i in range(6_000)]
    folder = tmp_path / "outbox" / "big"
    other = tmp_path / "outbox_b"
    async with running_service(ServiceConfig(rate=2500.0)) as svc:
        a = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path)).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            _drop(a.inbox, "big.csv", ids)
            with anyio.fail_after(90):
                while not any(len(read_lines(p)) >= 1000 for p in folder.glob(".results.e*")):
                    a.check_alive()
                    await anyio.sleep(0.02)
            await a.kill()
            extra = [*_common(postgres_url, tmp_path), "--outbox", str(other)]
            b = DaemonProcess(tmp_path, svc.url, extra=extra).start()
            with anyio.fail_after(120):
                while (
                    not (a.inbox / "done" / "big.csv").exists()
                    and not (a.inbox / "failed" / "big.csv").exists()
                ):
                    b.check_alive()
                    await anyio.sleep(0.1)
            assert await b.stop() == 0
        finally:
            a.ensure_dead()
            if b is not None:
                b.ensure_dead()
        sent = [i for record in svc.store.tasks.values() for i in record.ids]
    # It ends where its rows are (as one daemon restarted with another --outbox), not failed
    # at the taker, its committed rows hidden in the first outbox.
    assert (a.inbox / "done" / "big.csv").exists(), b.tail(10)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "done" and summary["tagged"] == len(ids)
    got = [r["id"] for r in read_lines(folder / "results.jsonl")]
    assert len(got) == len(set(got)) and sorted(got) == sorted(ids)
    assert len(sent) == len(set(sent)) == len(ids), "a row was sent twice"
    assert list(other.iterdir()) == []  # (no empty folder of it left in the taker's outbox)
