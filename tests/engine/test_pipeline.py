"""End to end against the reference service over loopback: the five promises."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import FaultSpec, ServiceConfig, running_service

from .helpers import (
    RecordingClient,
    assert_exactly_once,
    client_config,
    dead_port,
    free_port,
    read_outcomes,
    write_csv,
)

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2, fsync_seconds=10.0)


async def test_clean_run_every_id_once_and_file_shapes(tmp_path: Path) -> None:
    manifest = write_csv(tmp_path / "m.csv.gz", 3000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            engine=EngineConfig(rotate_images=1000, poll_min=0.02, poll_max=0.2),
        )
    assert summary.complete and summary.tasks == 3
    assert summary.tagged + summary.failed == 3000 and summary.rejected == 0
    assert_exactly_once(out, rej, {f"p{i}" for i in range(3000)})
    assert len({r["taskId"] for r in read_outcomes(out, rej).results}) == 3


async def test_faults_exactly_once_and_limits(tmp_path: Path) -> None:
    """Injected 500/429/drops/ambiguous commits: every id exactly once, no limit broken."""
    n = 6000
    bad = ["p17,https://img.example/dup.jpg,acme,TOP", "zz,notaurl,,"]
    manifest = write_csv(tmp_path / "m.csv", n, extra=bad)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    faults = FaultSpec.parse("500=0.06,429=0.05:0.05s,drop=0.04,ambiguous=0.08", seed=7)
    # The reference service lists a task as soon as it is created: a create lost on the way
    # (a drop) need not wait the default 5 s for a lagging list.
    engine = EngineConfig(
        chunk_size=250,
        rotate_images=1500,
        poll_min=0.02,
        poll_max=0.2,
        give_up_after=60,
        list_lag=0.5,
    )
    async with (
        running_service(ServiceConfig(faults=faults)) as svc,
        RecordingClient(config=client_config(svc.url)) as client,
    ):
        summary = await run_pipeline([manifest], client=client, out=out, rejects=rej, engine=engine)
        client.assert_limits()
        # The faults really happened and were survived.
        assert client.stats.ambiguous_writes > 0 and client.stats.rate_limited > 0
        # Promise 2: no second task per run token (each description is unique).
        descriptions = [t.description for t in await client.list_tasks()]
        assert len(descriptions) == len(set(descriptions)) == summary.tasks
    assert summary.complete
    assert_exactly_once(out, rej, {f"p{i}" for i in range(n)} | {"zz"}, duplicates=1)


async def test_bad_rows_of_every_kind_one_reject_each(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"id": "ok1", "url": "https://img.example/1.jpg"},
        {"url": "https://img.example/2.jpg"},
        {"id": "b1", "url": "ftp://x"},
        {"id": "b2", "url": "https://img.example/3.jpg", "detection": ["NOPE"]},
        {"id": "b3", "url": "https://img.example/3.jpg", "price": True},
        {"id": "ok1", "url": "https://img.example/again.jpg"},
        {"id": "ok2", "url": "https://img.example/4.jpg", "age": ["20s", "30s"]},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n{oops\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    o = read_outcomes(out, rej)
    assert sorted(o.ids) == ["ok1", "ok2"]
    assert len(o.rejects) == 6
    assert {r["line"] for r in o.rejects} == {2, 3, 4, 5, 6, 8}
    assert all(r["stage"] == "client" and r["source"] == str(manifest) for r in o.rejects)


async def test_server_validation_failures_become_rejects(tmp_path: Path) -> None:
    """A row only the server refuses: one reject with the server's message."""
    manifest = write_csv(
        tmp_path / "m.csv", 50, extra=["long," + "https://img.example/" + "x" * 5000 + ".jpg,,"]
    )
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    o = assert_exactly_once(out, rej, {f"p{i}" for i in range(50)} | {"long"})
    stages = {r["id"]: r["stage"] for r in o.rejects}
    if "long" in stages:
        assert stages["long"] == "server-validation"


async def test_sqlite_sink_one_row_per_image(tmp_path: Path) -> None:
    import sqlite3

    manifest = write_csv(tmp_path / "m.csv", 500)
    out, rej = tmp_path / "out.db", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            engine=EngineConfig(sink="sqlite", poll_min=0.02, poll_max=0.2),
        )
    assert summary.complete
    with sqlite3.connect(out) as db:
        rows = db.execute("SELECT count(*), count(DISTINCT id) FROM results").fetchone()
        status = db.execute("SELECT DISTINCT status FROM results").fetchall()
    assert rows == (500, 500) and set(status) <= {("success",), ("failure",)}


async def test_sqlite_sink_holds_only_the_new_runs_rows_next_night(tmp_path: Path) -> None:
    """A completed run with ``sink = "sqlite"``, then next night's dump on the same path (a
    new run: its outputs are rewritten): the results table holds tonight's rows only, and an
    id rejected tonight has no row left from last night."""
    import sqlite3

    manifest = tmp_path / "m.csv"
    out, rej = tmp_path / "out.db", tmp_path / "rej.jsonl"
    engine = EngineConfig(sink="sqlite", poll_min=0.02, poll_max=0.2)
    async with running_service(ServiceConfig()) as svc:
        write_csv(manifest, 600)
        first = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=engine
        )
        # Tonight: fewer rows, and p5 with a URL the client refuses.
        lines = manifest.read_text().splitlines()[:301]
        lines[6] = "p5,ftp://img.example/5.jpg,acme,TOP"
        manifest.write_text("\n".join(lines) + "\n")
        second = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=engine
        )
    assert first.complete and second.complete and second.tagged + second.failed == 299
    with sqlite3.connect(out) as db:
        ids = {r[0] for r in db.execute("SELECT id FROM results")}
    assert ids == {f"p{i}" for i in range(300)} - {"p5"}
    o = read_outcomes(tmp_path / "none.jsonl", rej)
    assert [r["id"] for r in o.rejects] == ["p5"]


async def test_several_manifests_and_cross_file_duplicates(tmp_path: Path) -> None:
    a = write_csv(tmp_path / "a.csv", 300)
    b = write_csv(tmp_path / "b.csv", 300, start=200)  # p200..p299 repeat a.csv
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [a, b], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    o = assert_exactly_once(out, rej, {f"p{i}" for i in range(500)}, duplicates=100)
    assert {r["source"] for r in o.rejects} == {str(b)}


async def test_service_restart_mid_run(tmp_path: Path) -> None:
    """The service (with --state) restarts mid-run on the same port: the run completes."""
    n = 6000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    port = free_port()
    cfg = ServiceConfig(rate=4000.0, state_path=tmp_path / "service.db")
    engine = EngineConfig(rotate_images=1000, poll_min=0.02, poll_max=0.2, give_up_after=30)
    summary_box = []
    restarted = anyio.Event()

    async def pipeline() -> None:
        summary_box.append(
            await run_pipeline(
                [manifest],
                client=client_config(f"http://127.0.0.1:{port}"),
                out=out,
                rejects=rej,
                engine=engine,
            )
        )

    async with anyio.create_task_group() as tg:
        async with running_service(cfg, port=port):
            tg.start_soon(pipeline)
            # Stopped once the run wrote its first results (not a fixed 0.8 s, which on a
            # loaded machine may come before it sent anything: no restart mid-run then).
            with anyio.fail_after(60):
                while not out.exists() or out.stat().st_size == 0:
                    await anyio.sleep(0.02)
            assert not summary_box, "the run ended before the service stopped"
        await anyio.sleep(0.5)  # down for a while: connections refused
        async with running_service(cfg, port=port):
            restarted.set()
            with anyio.fail_after(60):
                while not summary_box:
                    await anyio.sleep(0.05)
    assert summary_box[0].complete
    assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})


async def test_unreachable_service_is_fatal_with_state_saved(tmp_path: Path) -> None:
    from fashiontag_pipeline.engine import FatalRunError

    manifest = write_csv(tmp_path / "m.csv", 10)
    with pytest.raises(FatalRunError, match="unreachable"):
        await run_pipeline(
            [manifest],
            client=client_config(f"http://127.0.0.1:{dead_port()}"),
            out=tmp_path / "out.jsonl",
            rejects=tmp_path / "rej.jsonl",
            engine=EngineConfig(give_up_after=0.5, linger_seconds=0.05),
        )
    assert (tmp_path / "out.jsonl.state").exists()


async def test_an_id_whose_first_row_is_bad_keeps_that_rows_outcome(tmp_path: Path) -> None:
    """README, repeated ids: the first row's outcome stands and every later row of the id is
    a ``duplicate id`` reject. A first row refused by the client's checks (a URL that is not
    http) recorded no id, so a later good row of that id was tagged too: one id in both the
    rejects and the results. Within one batch and across batches (p0's rows are 3,000 lines
    apart)."""
    m = write_csv(
        tmp_path / "m.csv",
        0,
        extra=[
            "p0,ftp://img.example/0.jpg,acme,TOP",
            "p1,ftp://img.example/1.jpg,acme,TOP",
            "p1,https://img.example/1.jpg,acme,TOP",
            *[f"q{i},https://img.example/q{i}.jpg,acme,TOP" for i in range(3000)],
            "p0,https://img.example/0.jpg,acme,TOP",
        ],
    )
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [m], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    o = read_outcomes(out, rej)
    assert not {r["id"] for r in o.results} & {"p0", "p1"}
    reasons = sorted((r["id"], r["reason"].split(" (")[0]) for r in o.rejects)
    assert [r for r in reasons if r[1] == "duplicate id"] == [
        ("p0", "duplicate id"),
        ("p1", "duplicate id"),
    ]
    assert len(o.results) == 3000
