"""Nightly ``fashiontag run --reuse STORE`` as cron runs it, night after night with the same
paths, against the reference service on loopback: what the operator is told when a night
stops, and what the next command does."""

from __future__ import annotations

import contextlib
import json
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, write_csv


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child: writes past ``limit`` bytes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


async def test_a_result_store_that_cannot_grow_says_so_and_the_same_command_finishes(
    tmp_path: Path,
) -> None:
    """Night 2 tags 4,900 new rows; no file may pass 2 MB, and the store's WAL (a result
    and its index entries per row) reaches it first. The line said ``cannot rollback - no
    transaction is active`` (SQLite had rolled the failed insert back itself, and the store's
    own ROLLBACK hid the full disk) and told the operator to move the store away, which
    makes the next night tag (and bill) the whole catalogue again. It must name the store
    and the cause, say that the same command resumes, and the same command must finish
    with every row billed once."""
    n = 5000
    store = tmp_path / "results.db"
    out = tmp_path / "night.jsonl"
    async with running_service(ServiceConfig()) as svc:
        write_csv(tmp_path / "m.csv", 100)
        args = run_args(svc.url, out, str(tmp_path / "m.csv"), "--reuse", str(store))
        first = await anyio.run_process(args, check=False, env=ENV)
        assert first.returncode == 0, first.stderr.decode()
        write_csv(tmp_path / "m.csv", n)  # the next night: 4,900 new products
        full = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                args, env=ENV, capture_output=True, preexec_fn=_file_size_limit(2_000_000)
            )
        )
        message = full.stderr.decode()
        assert full.returncode == 1, message
        assert f"result store {store}" in message, message
        assert "Traceback" not in message and "cannot rollback" not in message, message
        assert "move it away" not in message, message
        assert "the same command resumes" in message, message
        again = await anyio.run_process(args, check=False, env=ENV)
        assert again.returncode == 0, again.stderr.decode()
        billed = svc.store.image_count
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    assert billed == n  # the 100 stored rows once (night 1), the new ones once


async def test_an_sqlite_results_file_given_the_result_stores_path_leaves_the_store_alone(
    tmp_path: Path,
) -> None:
    """The nightly cron keeps its store at ``results.db`` (the docs' name); an ad hoc run of
    another file given ``--sink sqlite --out results.db`` (the natural name for SQLite
    results) took the store for a results file of its own: it emptied the store's
    ``results`` table (a new run cuts its output back to nothing), added a column to it,
    then stopped on ``table results has no column named id`` saying the same command
    resumes; the next night found an empty store and tagged, and billed, the whole
    catalogue again. It is refused before anything is written or sent, naming the file, and
    the next night reuses every row."""
    store = tmp_path / "results.db"
    write_csv(tmp_path / "m.csv", 50)
    write_csv(tmp_path / "extra.csv", 3, start=1000)
    async with running_service(ServiceConfig()) as svc:
        night = run_args(svc.url, tmp_path / "n1.jsonl", str(tmp_path / "m.csv"))
        first = await anyio.run_process([*night, "--reuse", str(store)], check=False, env=ENV)
        assert first.returncode == 0, first.stderr.decode()
        before = store.read_bytes()
        tasks = len(svc.store.tasks)
        adhoc = await anyio.run_process(
            [
                *run_args(svc.url, store, str(tmp_path / "extra.csv")),
                *("--sink", "sqlite", "--state", str(tmp_path / "adhoc.state")),
            ],
            check=False,
            env=ENV,
        )
        message = adhoc.stderr.decode()
        assert adhoc.returncode == 1, message
        assert str(store) in message and "result store" in message, message
        assert "resumes once this is fixed" not in message, message
        assert len(svc.store.tasks) == tasks  # nothing sent
        assert store.read_bytes() == before
        night2 = run_args(svc.url, tmp_path / "n2.jsonl", str(tmp_path / "m.csv"))
        second = await anyio.run_process(
            [*night2, "--reuse", str(store), "--summary", str(tmp_path / "s.json")],
            check=False,
            env=ENV,
        )
        assert second.returncode == 0, second.stderr.decode()
        assert len(svc.store.tasks) == tasks  # every row answered from the store
    assert json.loads((tmp_path / "s.json").read_text())["reused"] == 50


async def test_a_night_given_the_result_store_as_its_state_is_refused_before_a_request(
    tmp_path: Path,
) -> None:
    """``--state`` and ``--reuse`` swapped in the cron line (both SQLite paths): the run
    wrote its state's tables into the result store, made a new, empty store at the state's
    path (a warning said it "did not exist") and tagged, and billed, the whole catalogue. A
    state file that is a result store is refused before anything is written or sent."""
    store, state = tmp_path / "results.db", tmp_path / "night.state"
    write_csv(tmp_path / "m.csv", 40)
    async with running_service(ServiceConfig()) as svc:
        night = run_args(svc.url, tmp_path / "n.jsonl", str(tmp_path / "m.csv"))
        first = await anyio.run_process(
            [*night, "--state", str(state), "--reuse", str(store)], check=False, env=ENV
        )
        assert first.returncode == 0, first.stderr.decode()
        state.unlink()  # (a state on a tmpfs after a reboot, or a new state path)
        before = store.read_bytes()
        tasks = len(svc.store.tasks)
        swapped = await anyio.run_process(
            [*night, "--state", str(store), "--reuse", str(state)], check=False, env=ENV
        )
        message = swapped.stderr.decode()
        assert swapped.returncode == 1, message
        assert f"state file {store}" in message and "result store" in message, message
        assert len(svc.store.tasks) == tasks  # nothing sent
    assert store.read_bytes() == before
    assert not state.exists()


async def test_a_result_store_on_a_read_only_mount_says_so_not_to_move_it_away(
    tmp_path: Path,
) -> None:
    """Last night's store is on a file system that went read-only (a remount after an I/O
    error, a snapshot mounted to look at). Tonight's run and ``reuse stats`` both said
    ``unable to open database file (it is left untouched; move it away to start an empty
    store, and every row will be tagged again)``: the store is whole, and moving it away
    makes the night tag, and bill, the whole catalogue again. They say the folder is
    read-only and that the same command resumes once it can be written; nothing is sent, and
    once it can, the night reuses every row."""
    folder = tmp_path / "stores"
    folder.mkdir()
    store = folder / "results.db"
    write_csv(tmp_path / "m.csv", 30)
    async with running_service(ServiceConfig()) as svc:
        last = run_args(svc.url, tmp_path / "n1.jsonl", str(tmp_path / "m.csv"))
        first = await anyio.run_process([*last, "--reuse", str(store)], check=False, env=ENV)
        assert first.returncode == 0, first.stderr.decode()
        night = run_args(svc.url, tmp_path / "n.jsonl", str(tmp_path / "m.csv"))
        night += ["--reuse", str(store), "--summary", str(tmp_path / "s.json")]
        tasks = len(svc.store.tasks)
        bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
        if bound.returncode != 0:
            pytest.skip(f"cannot bind-mount: {bound.stderr.decode().strip()}")
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
            stats_cmd = [sys.executable, "-m", "fashiontag_pipeline", "reuse", "stats", str(store)]
            stats = await anyio.run_process(stats_cmd, check=False, env=ENV)
            second = await anyio.run_process(night, check=False, env=ENV)
        finally:
            subprocess.run(["umount", str(folder)], check=False)
        for done in (stats, second):
            message = done.stderr.decode()
            assert done.returncode == 1, message
            assert f"result store {store}" in message and "read-only" in message, message
            assert "move it away" not in message and "Traceback" not in message, message
        assert "the same command resumes" in second.stderr.decode()
        assert len(svc.store.tasks) == tasks  # nothing sent
        again = await anyio.run_process(night, check=False, env=ENV)
        assert again.returncode == 0, again.stderr.decode()
        assert len(svc.store.tasks) == tasks  # every row answered from the store
    assert_exactly_once(tmp_path / "n.jsonl", tmp_path / "n.rej", ids_of(30))
    assert json.loads((tmp_path / "s.json").read_text())["reused"] == 30


async def test_a_store_that_cannot_record_the_run_at_its_end_fails_no_complete_run(
    tmp_path: Path,
) -> None:
    """``fashiontag run --reuse STORE`` whose store refuses the last write of the run, the
    line of history ``reuse stats`` shows (the store locked past its busy timeout by another
    run's long transaction, a full disk: here its ``runs`` table refusing every insert): every
    row had its outcome and its result stored, yet the run exited 1 and ``--summary`` said it
    was not complete, so the loader skipped the night and cron's retry sent the rows again.
    The run is complete (exit 0); stderr says the store missed this run's line."""
    manifest = write_csv(tmp_path / "m.csv", 200)
    store = tmp_path / "reuse.db"
    summary = tmp_path / "summary.json"
    async with running_service(ServiceConfig()) as svc:
        first = await anyio.run_process(
            [*run_args(svc.url, tmp_path / "a.jsonl", str(manifest)), "--reuse", str(store)],
            check=False,
            env=ENV,
        )
        assert first.returncode == 0, first.stderr.decode()
        with contextlib.closing(sqlite3.connect(store)) as db:
            db.execute(
                "CREATE TRIGGER full BEFORE INSERT ON runs"
                " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
            db.commit()
        other = write_csv(tmp_path / "n.csv", 200, start=1000)
        out = tmp_path / "b.jsonl"
        args = [*run_args(svc.url, out, str(other)), "--reuse", str(store)]
        result = await anyio.run_process([*args, "--summary", str(summary)], check=False, env=ENV)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "Traceback" not in stderr and str(store) in stderr, stderr
    assert "was not recorded" in stderr and "move it away" not in stderr, stderr
    assert json.loads(summary.read_text())["complete"] is True
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(1000, 1200)})
