"""``fashiontag daemon`` as a real process against the reference service on loopback.

Files dropped over time in all three ways (atomic rename, ``NAME.ready``, copy and settle), a
file written slowly, an unreadable file, a duplicate, ids colliding across manifests, /metrics
compared with the outputs, systemd notifications on a test socket; SIGKILL mid-manifest and a
restart; SIGTERM with writes in flight; a service outage with /readyz saying why.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import DaemonProcess, drop_atomic, metric_samples, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")


def _ids(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i}" for i in range(start, start + n)]


def _assert_once(folder: Path, ids: list[str], *, rejected: int = 0) -> None:
    results = read_lines(folder / "results.jsonl")
    rejects = read_lines(folder / "rejects.jsonl")
    got = [r["id"] for r in results] + [r["id"] for r in rejects]
    assert len(got) == len(set(got)), "an id was written twice"
    assert set(got) == set(ids)
    assert len(rejects) == rejected
    assert all("/" not in r["id"] for r in results), "an id kept its namespace"


async def test_every_kind_of_drop_is_tagged_once_with_its_own_ids(tmp_path: Path) -> None:
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.setblocking(False)
    ids = _ids("p", 700)  # every manifest uses the same ids
    messages: list[str] = []

    async def drain_socket() -> None:
        # A datagram socket queues few messages (net.unix.max_dgram_qlen): read them as they
        # come, like systemd does (the daemon drops a message rather than block on a full one).
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                await anyio.sleep(0.01)

    async with running_service(ServiceConfig()) as svc, anyio.create_task_group() as tg:
        tg.start_soon(drain_socket)
        daemon = DaemonProcess(
            tmp_path,
            svc.url,
            env={"NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "400000"},
            settle=1.5,  # (see slow.csv below)
        ).start()
        try:
            await daemon.wait_ready_endpoint()
            inbox = daemon.inbox
            drop_atomic(inbox, "atomic.csv", write_manifest(Path(), ids, url_tag="a"))
            (inbox / "marked.csv").write_bytes(write_manifest(Path(), ids, url_tag="m"))
            (inbox / "marked.csv.ready").write_bytes(b"")
            (inbox / "copied.csv").write_bytes(write_manifest(Path(), ids, url_tag="c"))
            (inbox / "broken.csv").write_bytes(b"\x00\x01 not,a manifest\n\x02")
            # Written slowly: pauses shorter than --settle, for longer than it in all. (With the
            # helper's 0.4 s, a 0.2 s pause took longer on a loaded machine: the daemon took the
            # file half-written, status failed, 4 runs of 5.)
            slow = write_manifest(Path(), ids, url_tag="s")
            with (inbox / "slow.csv").open("wb") as fh:
                step = len(slow) // 12 + 1
                for start in range(0, len(slow), step):
                    fh.write(slow[start : start + step])
                    fh.flush()
                    await anyio.sleep(0.2)
            summaries = {
                stem: await daemon.wait_summary(stem)
                for stem in ("atomic", "marked", "copied", "slow", "broken")
            }
            # The same content again, once the first is done: a duplicate, not sent again.
            drop_atomic(inbox, "again.csv", write_manifest(Path(), ids, url_tag="a"))
            summaries["again"] = await daemon.wait_summary("again")
            _, metrics_text = await daemon.get("/metrics")
            status_code, status_text = await daemon.get("/status")
            ready_code, _ = await daemon.get("/readyz")
            assert await daemon.stop() == 0
            await anyio.sleep(0.1)
        finally:
            daemon.ensure_dead()
            tg.cancel_scope.cancel()
        records = list(svc.store.tasks.values())
    sock.close()
    for stem in ("atomic", "marked", "copied", "slow"):
        assert summaries[stem]["status"] == "done", summaries[stem]
        assert summaries[stem]["rows_read"] == 700
        assert summaries[stem]["tagged"] + summaries[stem]["failed"] == 700
        assert summaries[stem]["tasks"] >= 1 and summaries[stem]["pages"] >= 7
        _assert_once(daemon.outbox / stem, ids)
    assert summaries["broken"]["status"] == "failed" and summaries["broken"]["reason"]
    assert (daemon.inbox / "failed" / "broken.csv").exists()
    reason = json.loads((daemon.inbox / "failed" / "broken.csv.error.json").read_text())
    assert reason["reason"]
    assert summaries["again"]["status"] == "duplicate"
    assert summaries["again"]["duplicate_of"] == "atomic.csv"
    assert sorted(p.name for p in (daemon.inbox / "done").iterdir()) == [
        "again.csv",
        "atomic.csv",
        "copied.csv",
        "marked.csv",
        "slow.csv",
    ]
    assert not (daemon.inbox / "marked.csv.ready").exists()
    # The service was asked for each manifest's rows once (the duplicate was not sent).
    sent = [i for r in records for i in r.ids]
    assert len(sent) == 4 * 700 == len(set(sent))
    # Metrics equal the outputs.
    samples = metric_samples(metrics_text)
    tagged = sum(s["tagged"] for s in summaries.values() if s["status"] == "done")
    failed = sum(s["failed"] for s in summaries.values() if s["status"] == "done")
    assert samples[("fashiontag_rows_total", (("outcome", "tagged"),))] == tagged
    assert samples[("fashiontag_rows_total", (("outcome", "failed"),))] == failed
    assert samples[("fashiontag_rows_total", (("outcome", "rejected"),))] == 0
    assert samples[("fashiontag_manifests_total", (("status", "done"),))] == 4
    assert samples[("fashiontag_manifests_total", (("status", "failed"),))] == 1
    assert samples[("fashiontag_manifests_total", (("status", "duplicate"),))] == 1
    assert samples[("fashiontag_requests_total", (("code", "202"), ("op", "create")))] >= 1
    assert samples[("fashiontag_requests_total", (("code", "200"), ("op", "results")))] >= 28
    assert status_code == 200 and len(json.loads(status_text)["recent"]) == 6
    assert ready_code == 200
    # systemd: READY when scanning, WATCHDOG at half of WATCHDOG_USEC, STOPPING on SIGTERM.
    assert any(m.startswith("READY=1") for m in messages), messages
    assert "WATCHDOG=1" in messages, messages
    stopping = [n for n, m in enumerate(messages) if m.startswith("STOPPING=1")]
    assert stopping and stopping[0] > 0, messages
    # stdout stays empty; every stderr line is a JSON object.
    assert daemon.stdout_path.read_bytes() == b""
    assert any(line["event"] == "manifest complete" for line in daemon.logs())


async def test_sigkill_mid_manifest_then_restart_writes_every_id_once(tmp_path: Path) -> None:
    ids_big = _ids("p", 12_000)
    ids_small = _ids("p", 900)  # collides with the big one's ids
    fair = ["--max-pending-rows", "3000"]
    async with running_service(ServiceConfig(rate=4000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=fair).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), ids_big))
            drop_atomic(daemon.inbox, "small.csv", write_manifest(Path(), ids_small))
            results = daemon.outbox / "big" / "results.jsonl"
            with anyio.fail_after(60):
                while len(read_lines(results)) < 2000:
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            await daemon.kill()
            assert (daemon.inbox / ".work" / "big.csv").exists()
            small_done_before = (daemon.outbox / "small" / "summary.json").exists()
            daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port, extra=fair).start()
            big = await daemon.wait_summary("big", timeout=90)
            small = await daemon.wait_summary("small", timeout=90)
            _, metrics_text = await daemon.get("/metrics")
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        records = list(svc.store.tasks.values())
    assert big["status"] == small["status"] == "done"
    # Equal ids of the two manifests were sent distinct (JOB/ID), each once in its task.
    assert all(len(r.ids) == len(set(r.ids)) for r in records)
    _assert_once(daemon.outbox / "big", ids_big)
    _assert_once(daemon.outbox / "small", ids_small)
    # The restarted process counts every row of the manifests it completed.
    samples = metric_samples(metrics_text)
    rows = (
        samples[("fashiontag_rows_total", (("outcome", "tagged"),))]
        + samples[("fashiontag_rows_total", (("outcome", "failed"),))]
    )
    completed_after_restart = [big] if small_done_before else [big, small]
    assert rows == sum(s["tagged"] + s["failed"] for s in completed_after_restart)


async def test_sigterm_drains_writes_in_flight_and_a_restart_finishes(tmp_path: Path) -> None:
    ids = _ids("p", 15_000)
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--drain-timeout", "20"]).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.fail_after(60):
                while True:
                    daemon.check_alive()
                    _, text = await daemon.get("/status")
                    active = json.loads(text)["active"]
                    if active and active[0]["submitted"] >= 3000:
                        break
                    await anyio.sleep(0.05)
            daemon.signal(signal.SIGTERM)
            assert await daemon.wait_exit(timeout=25) == 0
            events = [line["event"] for line in daemon.logs()]
            assert any(e.startswith("draining") for e in events)
            assert not (daemon.outbox / "m" / "summary.json").exists()
            assert (daemon.inbox / ".work" / "m.csv").exists()
            daemon = DaemonProcess(tmp_path, svc.url, port=daemon.port).start()
            summary = await daemon.wait_summary("m", timeout=90)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done"
    _assert_once(daemon.outbox / "m", ids)


async def test_a_service_outage_is_waited_out_and_readyz_says_why(tmp_path: Path) -> None:
    ids = _ids("p", 3000)
    config_file = tmp_path / "daemon.toml"
    config_file.write_text("[daemon]\nunreachable_after = 0.5\n")
    service_state = tmp_path / "service.state"
    async with running_service(ServiceConfig(state_path=service_state, rate=2000.0)) as svc:
        port = svc.port
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--config", str(config_file)]).start()
        await daemon.wait_ready_endpoint()
        drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
        with anyio.fail_after(60):
            while not read_lines(daemon.outbox / "m" / "results.jsonl"):
                daemon.check_alive()
                await anyio.sleep(0.05)
    try:
        # The service is down: the daemon keeps trying and /readyz says why.
        with anyio.fail_after(30):
            while True:
                daemon.check_alive()
                code, body = await daemon.get("/readyz")
                if code == 503 and "unreachable" in body:
                    break
                await anyio.sleep(0.1)
        await anyio.sleep(1.0)
        daemon.check_alive()
        async with running_service(ServiceConfig(state_path=service_state, rate=2000.0), port=port):
            summary = await daemon.wait_summary("m", timeout=90)
            code, _ = await daemon.get("/readyz")
            assert code == 200
            assert await daemon.stop() == 0
    finally:
        daemon.ensure_dead()
    assert summary["status"] == "done"
    _assert_once(daemon.outbox / "m", ids)


async def test_content_equal_to_a_manifest_in_flight_waits_then_is_a_duplicate(
    tmp_path: Path,
) -> None:
    ids = _ids("p", 6000)
    data = write_manifest(Path(), ids)
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "first.csv", data)
            with anyio.fail_after(30):
                while not (daemon.inbox / ".work" / "first.csv").exists():
                    await anyio.sleep(0.02)
            drop_atomic(daemon.inbox, "second.csv", data)
            second = await daemon.wait_summary("second", timeout=60)
            first = json.loads((daemon.outbox / "first" / "summary.json").read_text())
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        sent = [i for r in svc.store.tasks.values() for i in r.ids]
    assert first["status"] == "done" and second["status"] == "duplicate"
    assert second["duplicate_of"] == "first.csv"
    assert second["finished_at"] >= first["finished_at"]
    assert len(sent) == 6000  # the second was never sent
    _assert_once(daemon.outbox / "first", ids)


async def test_a_small_manifest_dropped_behind_a_big_one_is_done_first(tmp_path: Path) -> None:
    """Fair interleaving: with --max-pending-rows, a 300-row manifest dropped while a
    30,000-row one is being tagged (at 2,000 images/s) completes while the big one is still in
    flight.

    The big one had 8,700 to 16,000 lines when the small one was done (idle machine, or three
    copies at once), and once 25,700 in a full suite of 4 workers on 2 cores, where the service
    (its rate a wall-clock one) went on while the daemon waited for a core: at 3,000 images/s
    that was past the bound below. At 2,000 images/s it met 25,700 again beside helpers (twice
    in two such runs). The bound is 28,000: the small one queued behind the big one's rows
    (the unfair order) would end with ~29,000 or more written: its task comes after theirs."""
    big_ids, small_ids = _ids("b", 30_000), _ids("s", 300)
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--max-pending-rows", "3000"]).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "big.csv", write_manifest(Path(), big_ids))
            with anyio.fail_after(60):
                while not read_lines(daemon.outbox / "big" / "results.jsonl"):
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            drop_atomic(daemon.inbox, "small.csv", write_manifest(Path(), small_ids))
            await daemon.wait_summary("small", timeout=60)
            big_done_first = (daemon.outbox / "big" / "summary.json").exists()
            big_lines = len(read_lines(daemon.outbox / "big" / "results.jsonl"))
            await daemon.wait_summary("big", timeout=120)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert not big_done_first and big_lines < 28_000, big_lines
    _assert_once(daemon.outbox / "small", small_ids)
    _assert_once(daemon.outbox / "big", big_ids)


async def test_jsonl_drops_of_the_same_ids_are_each_tagged_once_under_their_own_ids(
    tmp_path: Path,
) -> None:
    """JSONL manifests take the validator's block path (a block decoded and built column by
    column); in the daemon each row is then sent as ``JOB/ID``. Two drops of the same ids at
    once, each with a bad line and context fields: every id once per drop, under its own id,
    the bad line one reject, each row sent once (under ids of its own job)."""
    ids = _ids("j", 600)

    def jsonl(tag: str) -> bytes:
        rows = [
            json.dumps({"id": i, "url": f"https://img.example/{tag}{i}.jpg", "brand": "acme"})
            for i in ids
        ]
        rows[250] = json.dumps({"id": ids[250], "url": "ftp://img.example/x.jpg"})
        return ("\n".join(rows) + "\n").encode()

    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "one.jsonl", jsonl("a"))
            drop_atomic(daemon.inbox, "two.jsonl", jsonl("b"))
            summaries = [await daemon.wait_summary(stem) for stem in ("one", "two")]
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
        records = list(svc.store.tasks.values())
    for stem, summary in zip(("one", "two"), summaries, strict=True):
        assert summary["status"] == "done", summary
        assert summary["tagged"] + summary["failed"] == 599 and summary["rejected"] == 1
        _assert_once(daemon.outbox / stem, ids, rejected=1)
        (reject,) = read_lines(daemon.outbox / stem / "rejects.jsonl")
        assert reject["id"] == ids[250] and reject["line"] == 251 and reject["source"]
    sent = [i for r in records for i in r.ids]
    assert len(sent) == 2 * 599 == len(set(sent))
