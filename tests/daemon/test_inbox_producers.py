"""The inbox as real producers fill it, beside the documented ways (a rename, ``NAME.ready``,
a copy that settles): a file written in place in bursts with pauses longer than ``--settle``,
a file created empty and written later. Each row of a manifest is tagged once into its own
folder, or the summary says why not: never a manifest said done without some of its rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, read_lines

pytestmark = pytest.mark.skipif(os.name != "posix", reason="posix file semantics")


def _rows(ids: list[str]) -> bytes:
    return "".join(f"{i},https://img.example/{i}.jpg\n" for i in ids).encode()


async def _status(daemon: DaemonProcess) -> dict[str, object]:
    code, text = await daemon.get("/status")
    assert code == 200
    return dict(json.loads(text))


@pytest.mark.parametrize("state", ["sqlite", "postgresql"])
async def test_rows_appended_after_the_daemon_read_the_manifest_are_never_lost_in_silence(
    tmp_path: Path, state: str, request: pytest.FixtureRequest
) -> None:
    """An export writes ``catalogue.csv`` in place, its file held open, and pauses longer than
    ``--settle`` between bursts (a slow query): the daemon claims it after the first burst,
    reads it to its end, and the next burst lands in the file in ``.work/``. The summary said
    ``done`` with the first burst's rows, the rows appended were in no output and nothing said
    so. It now says ``failed``, why (the rows appended after the read were not tagged), and
    the manifest goes to ``failed/``: the producer drops the whole file again. The same with
    daemons sharing a PostgreSQL state, whose manifests each run an engine of their own: they
    said ``done`` still."""
    first = [f"a{i}" for i in range(20)]
    later = [f"b{i}" for i in range(10)]
    extra = [] if state == "sqlite" else ["--state", request.getfixturevalue("postgres_url")]
    async with running_service(ServiceConfig(rate=10.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            with (daemon.inbox / "catalogue.csv").open("ab") as export:
                export.write(b"id,url\n" + _rows(first))
                export.flush()
                with anyio.fail_after(20):  # settled, claimed, read to its end
                    while True:
                        daemon.check_alive()
                        active = (await _status(daemon))["active"]
                        if active and active[0]["rows_read"] == len(first):  # type: ignore[index]
                            break
                        await anyio.sleep(0.05)
                export.write(_rows(later))  # the next burst, into the file claimed
            summary = await daemon.wait_summary("catalogue", timeout=30)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    written = {r["id"] for r in read_lines(daemon.outbox / "catalogue" / "results.jsonl")}
    if written == set(first + later):
        # The reader had not met the file's end yet when the status said 20 rows (a loaded
        # machine: a CI run beside other work): the next burst was read as rows of it, and
        # tagged, once. Nothing to say then.
        assert svc.store.image_count == len(first + later)
        assert summary["status"] == "done", summary
        return
    assert written == set(first)  # the rows read, tagged once
    assert svc.store.image_count == len(first)
    assert summary["status"] == "failed", summary
    assert "grew" in summary["reason"] and "not tagged" in summary["reason"]
    assert (daemon.inbox / "failed" / "catalogue.csv").exists()
    error = json.loads((daemon.inbox / "failed" / "catalogue.csv.error.json").read_text())
    assert "grew" in error["reason"]


async def test_a_file_created_empty_and_written_later_is_tagged_whole(tmp_path: Path) -> None:
    """An export opens ``catalogue.csv`` (zero bytes), then runs its query for longer than
    ``--settle`` before it writes: the empty file settled and was claimed, and the rows then
    written went into the file claimed. Empty, it was never a manifest (no header): it waits
    for its content, said once, and is tagged whole once that settles."""
    ids = [f"a{i}" for i in range(20)]
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            with (daemon.inbox / "catalogue.csv").open("wb") as export:
                await anyio.sleep(daemon.settle * 4)  # the query, longer than --settle
                export.write(b"id,url\n" + _rows(ids))
            summary = await daemon.wait_summary("catalogue", timeout=30)
            await anyio.sleep(daemon.settle * 3)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    written = [r["id"] for r in read_lines(daemon.outbox / "catalogue" / "results.jsonl")]
    assert sorted(written) == sorted(ids), summary
    assert summary["status"] == "done" and summary["tagged"] == len(ids)
    assert svc.store.image_count == len(ids)
    assert [p.name for p in daemon.outbox.iterdir()] == ["catalogue"]
    said = [r for r in daemon.logs() if "catalogue.csv" in json.dumps(r) and "empty" in r["event"]]
    assert len(said) == 1, said


@pytest.mark.parametrize("state", ["sqlite", "postgresql"])
async def test_rows_written_into_a_preallocated_file_after_the_daemon_read_it_are_not_lost(
    tmp_path: Path, state: str, request: pytest.FixtureRequest
) -> None:
    """A copy that sets the file's size first and fills it in place (a Windows copy to the
    SMB share the inbox is, ``aria2c``'s preallocation) pauses longer than ``--settle``: the
    daemon claims the file while its tail is still NUL bytes, reads the first rows and the
    NULs (a row refused), and the copy's next burst fills the file claimed. Its size never
    changed, so the daemon said ``done`` with the first rows and one reject: the rows
    written later were in no output and nothing said so. Its content is now looked at
    again when it was written after it was read: the summary says ``failed`` and why, and
    the manifest goes to ``failed/``. The same with daemons sharing a PostgreSQL state."""
    first = [f"a{i}" for i in range(20)]
    later = [f"b{i}" for i in range(10)]
    head = b"id,url\n" + _rows(first)
    extra = [] if state == "sqlite" else ["--state", request.getfixturevalue("postgres_url")]
    async with running_service(ServiceConfig(rate=10.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=extra).start()
        try:
            await daemon.wait_ready_endpoint()
            with (daemon.inbox / "catalogue.csv").open("wb") as copy:
                copy.truncate(len(head) + len(_rows(later)))  # the size set first
                copy.write(head)
                copy.flush()
                with anyio.fail_after(20):  # settled, claimed, read to its end
                    while True:
                        daemon.check_alive()
                        active = (await _status(daemon))["active"]
                        if active and active[0]["rows_read"] >= len(first):  # type: ignore[index]
                            break
                        await anyio.sleep(0.05)
                copy.write(_rows(later))  # the next burst, into the file claimed
            summary = await daemon.wait_summary("catalogue", timeout=30)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    written = {r["id"] for r in read_lines(daemon.outbox / "catalogue" / "results.jsonl")}
    if summary["status"] == "done":
        assert written == set(first + later), summary
    assert summary["status"] == "failed", summary
    assert "written again" in summary["reason"], summary
    assert (daemon.inbox / "failed" / "catalogue.csv").exists()
