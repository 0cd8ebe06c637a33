"""A fleet of daemons on one PostgreSQL state, one of which sees its inbox mount go away for a
moment (an NFS or autofs mount dropped: the empty mount point shows through). Its repair
abandoned every claim in flight, also those the other daemon was tagging; once the mount was
back they were claimed again: every row sent (and billed) again, outputs in two folders."""

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
    tmp = inbox / f".{name}.part"
    tmp.write_bytes(write_manifest(Path(), ids))
    os.rename(tmp, inbox / name)


def _common(url: str, tmp_path: Path) -> list[str]:
    return ["--state", url, "--lease", "1", "--max-active", "1", *short_deadline(tmp_path)]


def _point(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    os.replace(tmp, link)


async def test_an_inbox_mount_gone_for_a_moment_on_one_daemon_abandons_no_claim(
    tmp_path: Path, postgres_url: str
) -> None:
    share = tmp_path / "share"
    (share / "inbox").mkdir(parents=True)
    (share / "outbox").mkdir()
    empty = tmp_path / "mountpoint"  # what the machine shows with the share not mounted
    empty.mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "inbox").symlink_to(share / "inbox")
    (tmp_path / "b" / "outbox").symlink_to(share / "outbox")
    ids = {n: [f"m{n}-{i}" for i in range(8_000)] for n in range(3)}
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        a = DaemonProcess(share, svc.url, extra=_common(postgres_url, tmp_path)).start()
        b = DaemonProcess(tmp_path / "b", svc.url, extra=_common(postgres_url, tmp_path))
        try:
            await a.wait_ready_endpoint()
            b.start()
            await b.wait_ready_endpoint()
            for n in range(3):
                _drop(a.inbox, f"m{n}.csv", ids[n])
            with anyio.fail_after(60):
                while sum(1 for _ in (share / "outbox").glob("m*/.results.e*")) < 2:
                    await anyio.sleep(0.05)
            _point(tmp_path / "b" / "inbox", empty)  # the share gone on B's machine
            await anyio.sleep(3.5)  # (repairs every --lease)
            _point(tmp_path / "b" / "inbox", share / "inbox")
            with anyio.fail_after(120):
                while len(list((share / "inbox" / "done").glob("*.csv"))) < 3:
                    a.check_alive()
                    await anyio.sleep(0.1)
            await anyio.sleep(2)
            assert await a.stop() == 0
            b_code = await b.stop()
        finally:
            a.ensure_dead()
            b.ensure_dead()
        billed = svc.store.image_count
    assert b_code == 0
    assert billed == 24_000, f"{billed - 24_000} rows sent (and billed) twice"
    for n in range(3):
        summary = json.loads((share / "outbox" / f"m{n}" / "summary.json").read_text())
        assert summary["status"] == "done"
        got = [r["id"] for r in read_lines(share / "outbox" / f"m{n}" / "results.jsonl")]
        assert sorted(got) == sorted(ids[n])
    assert sorted(p.name for p in (share / "outbox").iterdir()) == ["m0", "m1", "m2"]


async def test_a_state_note_removed_by_hand_stops_no_daemon_from_leasing(
    tmp_path: Path, postgres_url: str
) -> None:
    """An operator tidying the inbox removes its hidden state note (``rm
    INBOX/.fashiontag-daemon.state``; a sync of the producer's folder with ``--delete``): the
    daemons of the fleet, each taking a missing note for its inbox mount gone, leased nothing
    more, for as long as they ran: every manifest dropped after it was claimed into ``.work``
    and waited there, the only word an error at the first. The inbox folder is still the one
    the daemon started on (a mount gone shows another folder): the note is written again."""
    share = tmp_path / "share"
    (share / "inbox").mkdir(parents=True)
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(share, svc.url, extra=_common(postgres_url, tmp_path)).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "m0.csv", ["a0", "a1"])
            await daemon.wait_summary("m0")
            (daemon.inbox / ".fashiontag-daemon.state").unlink()
            _drop(daemon.inbox, "m1.csv", ["b0", "b1"])
            with anyio.move_on_after(20):
                while not (daemon.outbox / "m1" / "summary.json").exists():
                    daemon.check_alive()
                    await anyio.sleep(0.1)
            assert (daemon.outbox / "m1" / "summary.json").exists(), daemon.tail(8)
            summary = await daemon.wait_summary("m1")
            assert (daemon.inbox / ".fashiontag-daemon.state").read_text() == "postgresql\n"
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["tagged"] == 2
