"""``fashiontag daemon --reuse``: a manifest whose rows were tagged before (under other ids,
in another manifest) is answered from the result store; summary.json and /metrics count them
as ``reused``; the service's own task records show they were never sent again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..postgres import PostgresCluster
from .helpers import DaemonProcess, metric_samples, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")


def _drop(inbox: Path, name: str, data: bytes) -> None:
    tmp = inbox / f".{name}.part"
    tmp.write_bytes(data)
    os.rename(tmp, inbox / name)


async def test_daemon_reuses_rows_of_an_earlier_manifest(tmp_path: Path) -> None:
    store = tmp_path / "reuse.db"
    monday = [f"p{i}" for i in range(300)]
    # Tuesday: the same 300 images under new ids (renamed), plus 50 new images.
    tuesday = write_manifest(Path(), [f"p{i}" for i in range(350)]).replace(b"\np", b"\nq")
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--reuse", str(store)]).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "monday.csv", write_manifest(Path(), monday))
            first = await daemon.wait_summary("monday")
            before = set(svc.store.tasks)
            _drop(daemon.inbox, "tuesday.csv", tuesday)
            second = await daemon.wait_summary("tuesday")
            _, metrics_text = await daemon.get("/metrics")
            assert await daemon.stop() == 0
        finally:
            if daemon.proc and daemon.proc.poll() is None:
                daemon.proc.send_signal(signal.SIGKILL)
        sent = [i for tid, t in svc.store.tasks.items() if tid not in before for i in t.ids]
    assert first["status"] == "done" and first["reused"] == 0 and first["tagged"] == 300
    assert second["status"] == "done"
    assert second["reused"] == 300 and second["tagged"] + second["failed"] == 50
    # Only the 50 new images reached the service (ids as sent carry the job's namespace).
    assert sorted(i.split("/", 1)[1] for i in sent) == sorted(f"q{i}" for i in range(300, 350))
    results = read_lines(daemon.outbox / "tuesday" / "results.jsonl")
    ids = [r["id"] for r in results]
    assert len(ids) == len(set(ids)) == 350
    reused = {r["id"] for r in results if r.get("reused")}
    assert reused == {f"q{i}" for i in range(300)}  # their own ids, not monday's
    samples = metric_samples(metrics_text)
    assert samples[("fashiontag_rows_total", (("outcome", "reused"),))] == 300
    assert samples[("fashiontag_rows_total", (("outcome", "tagged"),))] == 300 + second["tagged"]


async def test_a_postgresql_result_store_restarted_between_manifests_is_used_again(
    tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """One daemon (its state in a file) keeps its result store in PostgreSQL: the database
    restarted (an upgrade, a failover) while the daemon was idle, and the next manifest
    stopped the daemon ("daemon stopped on an error", exit 1: the store's connections were
    gone for good). The store's connections are opened again: the manifest is reused from
    the store and tagged as ever, the daemon still runs."""
    monday = [f"p{i}" for i in range(200)]
    tuesday = write_manifest(Path(), [f"p{i}" for i in range(250)]).replace(b"\np", b"\nq")
    async with running_service(ServiceConfig()) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--reuse", postgres_url]).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "monday.csv", write_manifest(Path(), monday))
            first = await daemon.wait_summary("monday")
            await anyio.to_thread.run_sync(postgres_cluster.restart, "immediate")
            _drop(daemon.inbox, "tuesday.csv", tuesday)
            second = await daemon.wait_summary("tuesday")
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert first["status"] == "done" and first["tagged"] == 200
    assert second["status"] == "done" and second["reused"] == 200
    assert second["tagged"] + second["failed"] == 50
    ids = [r["id"] for r in read_lines(daemon.outbox / "tuesday" / "results.jsonl")]
    assert len(ids) == len(set(ids)) == 250


async def test_status_of_a_manifest_in_flight_counts_its_reused_rows(tmp_path: Path) -> None:
    """``/status`` shows each active manifest's rows with an outcome (``tagged``, ``failed``,
    ``rejected``) and those still ``pending``; the rows answered from the result store were in
    none of them: a night reused 9 rows in 10 showed ``rows_read`` 110 and 10 accounted for
    (a dashboard read it as 9% done, or 100 rows lost) until its summary.json said
    ``reused``. They are shown as ``reused``, so the figures add up to ``rows_read``."""
    import json

    from fashiontag_pipeline.engine import EngineConfig, run_pipeline

    from ..engine.helpers import client_config

    store = tmp_path / "reuse.db"
    monday = write_manifest(Path(), [f"p{i}" for i in range(100)])
    (tmp_path / "monday.csv").write_bytes(monday)
    async with running_service(ServiceConfig()) as fast:
        primed = await run_pipeline(
            [tmp_path / "monday.csv"],
            client=client_config(fast.url),
            out=tmp_path / "monday.jsonl",
            rejects=tmp_path / "monday.rej",
            engine=EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.1, reuse=str(store)),
        )
    assert primed.complete and primed.tagged == 100
    # Tuesday: those 100 images under other ids, and 10 new ones for a slow service.
    tuesday = write_manifest(Path(), [f"p{i}" for i in range(110)]).replace(b"\np", b"\nq")
    async with running_service(ServiceConfig(rate=4.0)) as svc:
        daemon = DaemonProcess(tmp_path, svc.url, extra=["--reuse", str(store)]).start()
        try:
            await daemon.wait_ready_endpoint()
            _drop(daemon.inbox, "tuesday.csv", tuesday)
            active: dict[str, int] = {}
            with anyio.fail_after(30):
                while True:
                    daemon.check_alive()
                    found = json.loads((await daemon.get("/status"))[1])["active"]
                    if found and found[0]["rows_read"] == 110 and found[0]["pending"] > 0:
                        active = found[0]
                        break
                    await anyio.sleep(0.05)
            summary = await daemon.wait_summary("tuesday")
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done" and summary["reused"] == 100
    assert active.get("reused") == 100, active
    outcomes = sum(active[k] for k in ("tagged", "failed", "rejected", "reused", "pending"))
    assert outcomes == active["rows_read"], active
