"""Runs killed early (rows taken in, nothing counted written: checkpoint 0), then resumed by a
cron user who moved the manifest or ran from elsewhere in between: the resume takes its own
lines as its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import anyio
import anyio.abc
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    ENV,
    assert_exactly_once,
    job_marks,
    kill_when,
    run_args,
    short_deadline,
    write_csv,
)


def _copy_state(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite state (its WAL folded in)."""
    for extra in ("", "-wal", "-shm"):
        Path(f"{dst}{extra}").unlink(missing_ok=True)
    with (
        contextlib.closing(sqlite3.connect(src)) as a,
        contextlib.closing(sqlite3.connect(dst)) as b,
    ):
        a.backup(b)


async def test_a_client_reject_written_by_a_resume_under_another_name_is_the_runs_own(
    tmp_path: Path,
) -> None:
    """Begun as ``in/m.csv`` (relative), killed with its first 2,000 rows taken in and no
    outcome counted written; the file moved to ``done/m.csv`` and the run resumed from there,
    killed again as it wrote its first reject (before the commit that counts it: the state is
    as it was). The reject line named the manifest as given to that resume, the check at
    checkpoint 0 compared it with the name the run began with, and the third start was refused
    as "another run's" file: only --restart, every row paid again. A job's rejects name its
    manifests as the job recorded them, and the third start finishes the run."""
    (tmp_path / "in").mkdir()
    (tmp_path / "done").mkdir()
    write_csv(tmp_path / "in" / "m.csv", 3999, extra=["bad,ftp://img.example/bad.jpg"])
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    rej = out.with_suffix(".rej")
    slow_intake = tmp_path / "slow-intake.toml"  # V moves row by row: killed before the reject
    slow_intake.write_text("[engine]\nread_batch_rows = 1\n")
    flags = ["--state", str(state), "--config", str(slow_intake)]
    async with running_service(ServiceConfig(rate=500.0)) as svc:
        first = run_args(svc.url, out, "in/m.csv", *flags)
        proc = await anyio.open_process(first, stderr=subprocess.DEVNULL, env=ENV, cwd=tmp_path)
        await kill_when(proc, lambda: job_marks(state)[0] >= 0)
        validated, *ckpts = job_marks(state)
        assert ckpts == [0, 0] and validated < 3999, (validated, ckpts)
        before = tmp_path / "before.state"
        _copy_state(state, before)
        shutil.move(tmp_path / "in" / "m.csv", tmp_path / "done" / "m.csv")
        args = run_args(svc.url, out, "done/m.csv", *flags)
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV, cwd=tmp_path)
        await kill_when(proc, lambda: rej.exists() and rej.stat().st_size > 0)
        # Killed between its write and its commit: the state as before, the line written.
        _copy_state(before, state)
        out.write_bytes(b"")
        assert b'"stage":"client"' in rej.read_bytes()
        with anyio.fail_after(120):
            done = await anyio.run_process(
                args, check=False, env=ENV, stderr=subprocess.PIPE, cwd=tmp_path
            )
    message = done.stderr.decode()
    assert done.returncode == 0, message
    assert "another run" not in message
    o = assert_exactly_once(out, rej, {f"p{i}" for i in range(3999)} | {"bad"})
    assert {r["source"] for r in o.rejects} == {"in/m.csv"}
    assert os.listdir(tmp_path / "in") == []


async def test_a_resume_leaves_another_runs_sqlite_results_alone(tmp_path: Path) -> None:
    """``--sink sqlite``: a run killed with its rows taken in and no result counted written,
    another run given the same results file with its own state writes its 300 results there,
    and the first run's start again deleted them (every row past its checkpoint of 0) and
    exited 0. The row at the checkpoint (the first at 0) must be of an id this run took in,
    as the line of a JSONL file must: refused, the other run's rows kept."""
    a = write_csv(tmp_path / "a.csv", 1000)
    b = write_csv(tmp_path / "b.csv", 300, start=5000)
    out, state = tmp_path / "out.db", tmp_path / "a.state"
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        args = run_args(svc.url, out, str(a), "--state", str(state), "--sink", "sqlite")
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
        await kill_when(proc, lambda: job_marks(state)[0] >= 0)
        assert job_marks(state)[1:] == (0, 0)
        async with running_service(ServiceConfig()) as other:
            b_state = str(tmp_path / "b.state")
            args_b = run_args(other.url, out, str(b), "--state", b_state, "--sink", "sqlite")
            done_b = await anyio.run_process(args_b, check=False, env=ENV)
        assert done_b.returncode == 0, done_b.stderr.decode()
        again = await anyio.run_process(args, check=False, env=ENV)
    message = again.stderr.decode()
    assert again.returncode == 1, message
    assert "another run" in message and "--restart" in message
    with contextlib.closing(sqlite3.connect(out)) as db:
        ids = {r[0] for r in db.execute("SELECT id FROM results")}
    assert ids == {f"p{i}" for i in range(5000, 5300)}


@pytest.mark.parametrize("killed", ["nothing-written", "pages-written"])
async def test_a_resume_leaves_another_runs_results_of_the_same_ids_alone(
    tmp_path: Path, killed: str
) -> None:
    """The full catalogue's run is killed (with rows taken in and nothing counted written, or
    with some pages of its first task written); a run of a smaller dump of the same catalogue
    (its first 1,000 rows, the same ids) given the same ``--out`` with its own state writes
    its results there. The full run's same command took that file as its own, its lines
    being of ids it took in (the first at a checkpoint of 0; the one ending at the
    checkpoint, the same bytes as its own, the service answering the same rows alike): the
    other run's results were cut to nothing (or appended to as this run's) and it exited 0.
    A results line of this run is also of a task it recorded: refused, the file left as it
    is."""
    full = write_csv(tmp_path / "full.csv", 3000)
    part = write_csv(tmp_path / "part.csv", 1000)
    out, state = tmp_path / "out.jsonl", tmp_path / "full.state"
    args = ["--state", str(state), "--rotate-images", "1000", "--rotate-min-images", "1000"]
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        first = run_args(svc.url, out, str(full), *args)
        proc = await anyio.open_process(first, stderr=subprocess.DEVNULL, env=ENV)
        if killed == "nothing-written":
            await kill_when(proc, lambda: job_marks(state)[0] >= 0)
            assert job_marks(state)[1:] == (0, 0)
        else:
            await kill_when(proc, lambda: job_marks(state)[1] > 0)
        async with running_service(ServiceConfig()) as other:
            p_state = str(tmp_path / "part.state")
            done_p = await anyio.run_process(
                run_args(other.url, out, str(part), "--state", p_state), check=False, env=ENV
            )
        assert done_p.returncode == 0, done_p.stderr.decode()
        theirs = out.read_bytes()
        with anyio.fail_after(60):
            again = await anyio.run_process(first, check=False, env=ENV)
    message = again.stderr.decode()
    assert again.returncode == 1, message
    assert "another run" in message and "--restart" in message
    assert out.read_bytes() == theirs


@pytest.mark.parametrize("sink", ["jsonl", "sqlite"])
async def test_a_resume_leaves_alone_another_runs_results_answered_from_the_store(
    tmp_path: Path, sink: str
) -> None:
    """The full catalogue's run is killed with rows taken in and nothing counted written; a
    run of a smaller dump of it (its first 1,000 rows, the same ids) given the same ``--out``
    with its own state and ``--reuse`` of last night's store answers every row from the store
    (``"reused": true``). The full run's same command took the first such line as its own
    whatever its id (its own line of a reused row is written before the commit that takes the
    id in), cut the other run's results to nothing and exited 0. A reused line of an id this
    run took in is never its own uncommitted one (that id was answered another way, or its
    line was committed with it): refused, the file left as it is."""
    full = write_csv(tmp_path / "full.csv", 3000)
    part = write_csv(tmp_path / "part.csv", 1000)
    suffix = ".db" if sink == "sqlite" else ".jsonl"
    out, state = tmp_path / f"out{suffix}", tmp_path / "full.state"
    store = tmp_path / "store.db"
    flags = ["--sink", sink, *short_deadline(tmp_path)]
    async with running_service(ServiceConfig(rate=250.0)) as svc:
        async with running_service(ServiceConfig()) as other:
            last_night = run_args(
                other.url, tmp_path / f"last{suffix}", str(part), "--reuse", str(store)
            )
            seeded = await anyio.run_process(
                [*last_night, "--state", str(tmp_path / "last.state"), *flags],
                check=False,
                env=ENV,
            )
            assert seeded.returncode == 0, seeded.stderr.decode()
            first = run_args(svc.url, out, str(full), "--state", str(state), *flags)
            proc = await anyio.open_process(first, stderr=subprocess.DEVNULL, env=ENV)
            await kill_when(proc, lambda: job_marks(state)[0] >= 0)
            assert job_marks(state)[1:] == (0, 0)
            p_state = str(tmp_path / "part.state")
            done_p = await anyio.run_process(
                [*run_args(other.url, out, str(part), "--state", p_state, "--reuse", str(store)),
                 *flags],
                check=False,
                env=ENV,
            )  # fmt: skip
        assert done_p.returncode == 0, done_p.stderr.decode()
        theirs = out.read_bytes()
        with anyio.fail_after(60):
            again = await anyio.run_process(first, check=False, env=ENV)
    message = again.stderr.decode()
    assert again.returncode == 1, message
    assert "another run" in message and "--restart" in message
    assert out.read_bytes() == theirs


async def test_a_resume_takes_its_own_uncommitted_line_answered_from_the_store(
    tmp_path: Path,
) -> None:
    """The other side of the check above: a run with ``--reuse`` killed between writing its
    first line answered from the store and the commit that takes that row's id in (the state
    as before the write: checkpoint 0, the id not taken in) takes the line as its own: the
    same command finishes the run, every row once, exit 0."""
    part = write_csv(tmp_path / "part.csv", 500)
    full = tmp_path / "full.csv"
    head, *rows = part.read_text().splitlines()
    fresh = [f"q{i},https://img.example/q{i}.jpg,acme,TOP|SHOES" for i in range(20)]
    full.write_text("\n".join([head, *fresh, *rows]) + "\n")
    out, state, store = tmp_path / "out.jsonl", tmp_path / "s.state", tmp_path / "store.db"
    slow_intake = tmp_path / "slow-intake.toml"  # V moves row by row
    slow_intake.write_text("[engine]\nread_batch_rows = 1\n")
    flags = ["--state", str(state), "--reuse", str(store), "--config", str(slow_intake)]
    async with running_service(ServiceConfig(rate=100.0)) as svc:
        last_night = run_args(svc.url, tmp_path / "last.jsonl", str(part), "--reuse", str(store))
        seeded = await anyio.run_process(
            [*last_night, "--state", str(tmp_path / "last.state")], check=False, env=ENV
        )
        assert seeded.returncode == 0, seeded.stderr.decode()
        args = run_args(svc.url, out, str(full), *flags)
        for _ in range(5):  # (a loaded machine may look at the state too late: start again)
            for f in tmp_path.glob("s.state*"):
                f.unlink()
            out.unlink(missing_ok=True)
            proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
            await kill_when(proc, lambda: job_marks(state)[0] >= 0)
            validated, *ckpts = job_marks(state)
            if ckpts == [0, 0] and validated < 20:
                break
        assert ckpts == [0, 0] and validated < 20, (validated, ckpts)
        before = tmp_path / "before.state"
        _copy_state(state, before)
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
        await kill_when(proc, lambda: out.exists() and b'"reused":true' in out.read_bytes())
        # Killed between its write and its commit: the state as before, the lines written.
        _copy_state(before, state)
        assert b'"reused":true' in out.read_bytes().split(b"\n", 1)[0]
        with anyio.fail_after(120):
            done = await anyio.run_process(args, check=False, env=ENV, stderr=subprocess.PIPE)
    message = done.stderr.decode()
    assert done.returncode == 0, message
    o = assert_exactly_once(
        out, out.with_suffix(".rej"), {f"q{i}" for i in range(20)} | {f"p{i}" for i in range(500)}
    )
    assert sum(1 for r in o.results if r.get("reused")) == 500
