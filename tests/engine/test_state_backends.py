"""The state's contract, on both backends: a SQLite file and a schema of a real PostgreSQL.

Every test here runs twice (``state_location``): a run is tagged exactly once and found
complete again; a kill -9 resumes; tasks the service forgets are settled; an interrupted run
counts exactly its rows without an outcome; an unfinished state of other manifests is refused
untouched; two runs never share a state.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import ClientConfig, StateConflictError, StateError
from fashiontag_pipeline.engine import EngineConfig, RunControl, RunSummary, run_pipeline
from fashiontag_pipeline.engine.state import open_state
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..postgres import PostgresCluster
from .helpers import ENV, assert_exactly_once, client_config, read_outcomes, run_args, write_csv
from .proxy import Misbehaviour, misbehaving

StateAt = Callable[[str], Path | str]

FAST = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=1000,
    rotate_min_images=1000,
    read_again_window=3.0,  # (a row a repeated id stood in for: sent again 3 s after, not 30)
)


def ids_of(n: int) -> set[str]:
    return {f"p{i}" for i in range(n)}


def taken_in(state: Path | str) -> int:
    """Ids the state took in (read through the store, whatever the backend)."""
    db = open_state(state)
    try:
        return db.ids_taken()
    finally:
        db.close()


async def results_appear(path: Path) -> None:
    with anyio.fail_after(60):
        while not path.exists() or path.stat().st_size == 0:
            await anyio.sleep(0.01)


async def interrupted_run(
    manifest: Path, client: ClientConfig, out: Path, rej: Path, state: Path | str
) -> RunSummary:
    """A run stopped (drained) once its first results are written: part of its rows have no
    outcome. (Stopped 0.8 s after its start, it had written nothing yet on a loaded machine.)"""
    control = RunControl()
    async with anyio.create_task_group() as tg:

        async def stop_once_written() -> None:
            with anyio.fail_after(60):
                while not out.exists() or out.stat().st_size <= 100:
                    await anyio.sleep(0.02)
            control.stop()

        tg.start_soon(stop_once_written)
        summary = await run_pipeline(
            [manifest],
            client=client,
            out=out,
            rejects=rej,
            state=state,
            engine=FAST,
            control=control,
        )
        tg.cancel_scope.cancel()
    return summary


async def test_a_run_is_tagged_once_then_found_complete(
    tmp_path: Path, state_location: StateAt
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 3500)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state = state_location("nightly")
    async with running_service(ServiceConfig()) as svc:
        client = client_config(svc.url)
        first = await run_pipeline(
            [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
        again = await run_pipeline(
            [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
        other = write_csv(tmp_path / "next.csv", 500, start=10_000)
        night2 = await run_pipeline(
            [other], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
    assert first.complete and first.opened == "new" and first.tagged == 3500
    assert again.opened == "complete" and again.tagged == 3500 and again.submitted == 3500
    assert night2.complete and night2.opened == "replaced" and night2.tagged == 500
    assert (first.state == again.state and "#nightly" in first.state) or first.state.endswith(
        "nightly.state"
    )
    assert len(read_outcomes(out, rej).results) == 500


async def test_kill_9_mid_run_then_the_same_command_resumes(
    tmp_path: Path, state_location: StateAt
) -> None:
    n = 12_000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    state = str(state_location("killed"))
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", state)
        args += ["--summary", str(tmp_path / "summary.json")]
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await results_appear(out)
        await anyio.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        final = await anyio.run_process(args, check=False, env=ENV)
    assert final.returncode == 0, final.stderr.decode()
    summary = json.loads((tmp_path / "summary.json").read_bytes())
    assert summary["opened"] == "resumed" and summary["state"] == state
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))


async def test_tasks_the_service_forgets_are_settled(
    tmp_path: Path, state_location: StateAt
) -> None:
    n = 4000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    rules = Misbehaviour(forget_when_done={1, 3}, duplicate_across_pages={2})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest],
            client=client_config(proxy.url),
            out=out,
            rejects=rej,
            state=state_location("forgetful"),
            engine=FAST,
        )
    assert summary.complete and summary.lost_tasks >= 1
    o = assert_exactly_once(out, rej, ids_of(n))
    assert not {r["taskId"] for r in o.results} & proxy.forgotten


async def test_an_interrupted_run_counts_its_rows_without_outcome_and_guards_its_state(
    tmp_path: Path, state_location: StateAt
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 6000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state = state_location("interrupted")
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        client = client_config(svc.url)
        first = await interrupted_run(manifest, client, out, rej, state)
        assert first.interrupted and not first.complete
        o = read_outcomes(out, rej)
        assert first.unsettled == taken_in(state) - len(o.results) - len(o.rejects) > 0
        other = write_csv(tmp_path / "other.csv", 10)
        before = out.read_bytes()
        with pytest.raises(StateConflictError, match="unfinished run of other manifests"):
            await run_pipeline([other], client=client, out=out, rejects=rej, state=state)
        assert out.read_bytes() == before
        second = await run_pipeline(
            [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
    assert second.complete and second.opened == "resumed" and second.unsettled == 0
    assert_exactly_once(out, rej, ids_of(6000))


async def test_two_runs_never_share_a_state(tmp_path: Path, state_location: StateAt) -> None:
    manifest = write_csv(tmp_path / "m.csv", 8000)
    out = tmp_path / "results.jsonl"
    state = str(state_location("shared"))
    # Slow enough that the first run is still going when the second starts on a loaded machine.
    async with running_service(ServiceConfig(rate=1500.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", state)
        first = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await results_appear(out)
        second = await anyio.run_process(args, check=False, env=ENV)
        with anyio.fail_after(60):
            assert await first.wait() == 0
        await first.aclose()
        again = await anyio.run_process(args, check=False, env=ENV)
    assert second.returncode == 2, second.stderr.decode()
    # (It shares the outputs too, whose lock is tried first: before a state is made.)
    assert (
        b"in use by another run" in second.stderr
        or b"is being written by another run" in second.stderr
    )
    assert again.returncode == 0 and b"already complete" in again.stderr
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(8000))


async def test_a_run_whose_database_restarts_stops_clearly_or_goes_on_and_loses_nothing(
    tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """The restart lands either inside a transaction (the run stops, exit 1, naming the
    PostgreSQL state, and the same command resumes) or while the session sat idle between
    two (the run opens a new session and goes on, exit 0). Which one is the machine's
    timing; both keep every row exactly once."""
    n = 12_000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    state = f"{postgres_url}#restarted"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", state)
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await results_appear(out)
        await anyio.to_thread.run_sync(postgres_cluster.restart)
        with anyio.fail_after(60):
            code = await proc.wait()
        assert proc.stderr is not None
        stderr = (await proc.stderr.receive()).decode()
        await proc.aclose()
        final = await anyio.run_process(args, check=False, env=ENV)
    assert code in (0, 1), stderr
    assert "Traceback" not in stderr
    if code == 1:
        assert "PostgreSQL state" in stderr
    else:
        assert b"already complete" in final.stderr
    assert final.returncode == 0, final.stderr.decode()
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))


async def test_a_second_signal_stops_a_run_whose_database_does_not_answer(
    tmp_path: Path, postgres_url: str, postgres_cluster: PostgresCluster
) -> None:
    """A database that stops answering (a paused server; a partition, where no reset comes)
    held the run in a state call: "second signal, stopping now" was printed and the run went
    on waiting, for as long as the database did. It now leaves a few seconds later, exit
    130, saying so; the same command resumes once the database answers."""
    n = 8000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    state = f"{postgres_url}#paused"
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", state, "--summary", str(summary))
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
        await results_appear(out)
        with postgres_cluster.paused():
            await anyio.sleep(0.5)  # the run's next state call is now waiting for the server
            proc.send_signal(signal.SIGINT)
            await anyio.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            with anyio.move_on_after(9):
                await proc.wait()
            stopped = proc.returncode
            if stopped is None:
                proc.kill()
                await proc.wait()
        assert proc.stderr is not None
        stderr = b"".join([chunk async for chunk in proc.stderr]).decode()
        await proc.aclose()
        assert stopped == 130, stderr
        assert "does not answer" in stderr and "Traceback" not in stderr
        assert "does not answer" in json.loads(summary.read_text())["error"]
        final = await anyio.run_process(args, check=False, env=ENV)
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    assert billed == n
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))


async def test_an_output_shorter_than_its_checkpoint_is_an_error_not_a_gap(
    tmp_path: Path, state_location: StateAt
) -> None:
    """Lines the state counts as written but the file lost (a machine that died before they
    reached its disk, a file cut by hand) stop the resume with a clear error."""
    manifest = write_csv(tmp_path / "m.csv", 6000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state = state_location("cut")
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        client = client_config(svc.url)
        first = await interrupted_run(manifest, client, out, rej, state)
        assert first.interrupted and out.stat().st_size > 100
        out.write_bytes(out.read_bytes()[:100])
        with pytest.raises(StateError, match="committed lines are missing"):
            await run_pipeline([manifest], client=client, out=out, rejects=rej, state=state)


async def test_a_run_that_dies_on_a_state_error_is_never_recorded_complete(
    tmp_path: Path, state_location: StateAt, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The intake's state write fails before the manifest's rows are taken in: no count has
    them, so the counts agree. The run must still not be recorded complete: the same command
    then tags every row (it used to answer "already complete", with the rows never tagged)."""
    from fashiontag_pipeline.engine.state import Journal

    manifest = tmp_path / "m.jsonl"  # one row: read to its end before the intake fails
    manifest.write_text('{"id": "p0", "url": "https://img.example/0.jpg"}\n')
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state = state_location("dies")
    real = Journal._intake

    def refused(self: Journal, *args: object, **kwargs: object) -> object:
        raise StateError("the state refused the write (staged)")

    async with running_service(ServiceConfig()) as svc:
        client = client_config(svc.url)
        monkeypatch.setattr(Journal, "_intake", refused)
        with pytest.raises(StateError, match="staged"):
            await run_pipeline(
                [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
            )
        monkeypatch.setattr(Journal, "_intake", real)
        again = await run_pipeline(
            [manifest], client=client, out=out, rejects=rej, state=state, engine=FAST
        )
    assert again.opened != "complete" and again.complete and again.tagged == 1
    assert_exactly_once(out, rej, ids_of(1))


def test_dedupe_gives_each_row_the_first_position_of_its_id(state_location: StateAt) -> None:
    """Run-wide dedupe, on both backends: within a batch the first row of an id wins; across
    batches the position stored first wins; a batch of only new, distinct ids answers None."""
    db = open_state(state_location("dedupe"))
    try:
        with db.transaction():
            assert db.dedupe([("a", 1), ("b", 2), ("c", 3)]) is None
        with db.transaction():
            assert db.dedupe([("d", 4), ("e", 5), ("d", 6), ("e", 7), ("d", 8)]) == [4, 5, 4, 5, 4]
        with db.transaction():
            assert db.dedupe([("f", 9), ("b", 10), ("f", 11), ("a", 12)]) == [9, 2, 9, 1]
        assert db.ids_taken() == 6
    finally:
        db.close()


def test_the_ids_that_start_with_a_prefix(state_location: StateAt) -> None:
    """The run's ids that start with a prefix (how an id a service cut short is checked
    against the other tasks' ids), on both backends: in byte order, up to a limit."""
    db = open_state(state_location("prefix"))
    ids = ["item-0001", "item-0001-v2", "item-0001-\u00e9", "item-0002", "item-000", "Item-0001"]
    try:
        with db.transaction():
            db.dedupe([(ident, n) for n, ident in enumerate(ids)])
        assert db.ids_starting("item-0001", 5) == ["item-0001", "item-0001-v2", "item-0001-\u00e9"]
        assert db.ids_starting("item-0001-", 1) == ["item-0001-v2"]
        assert db.ids_starting("item-0003", 2) == []
    finally:
        db.close()


async def test_writes_refused_whole_are_split_on_either_backend(
    tmp_path: Path, state_location: StateAt
) -> None:
    """A front proxy refuses bodies over 40 kB (413) and every write carrying p1234 whole
    (400): chunks are split in the state (one transaction: the halves written ahead, the old
    chunk resolved) until they fit or the refused row is alone; every other row is tagged."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    rules = Misbehaviour(max_body_bytes=40_000, refuse_whole_with={"p1234"})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest],
            client=client_config(proxy.url),
            out=out,
            rejects=rej,
            state=state_location("split"),
            engine=FAST,
        )
    assert summary.complete and 413 in proxy.writes_refused
    o = assert_exactly_once(out, rej, ids_of(n))
    assert [r["id"] for r in o.rejects] == ["p1234"]


def test_a_state_just_closed_by_another_run_is_taken_not_refused(postgres_url: str) -> None:
    """The server releases a session's advisory lock when its backend has ended, a moment
    after the client closed the connection, and later still on a loaded machine (a fresh-clone
    CI run: a run that began just as the one before it ended was refused, "in use by another
    run"). The lock held a moment longer, as by a backend ending slowly, is waited for; one
    held for good is refused after a short grace."""
    import psycopg

    db = open_state(f"{postgres_url}#handover")
    schema = db.schema
    db.close()
    key = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
    with psycopg.connect(postgres_url.partition("#")[0], autocommit=True) as holder:
        holder.execute(key, (schema,))
        release = threading.Timer(
            0.3,
            lambda: holder.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (schema,)),
        )
        release.start()
        try:
            started = time.monotonic()
            db = open_state(f"{postgres_url}#handover")  # refused at once, before
            db.close()
        finally:
            release.join()
        assert 0.2 < time.monotonic() - started < 5
        holder.execute(key, (schema,))  # held for good: refused, after the grace
        with pytest.raises(StateConflictError, match="in use by another run"):
            open_state(f"{postgres_url}#handover")
