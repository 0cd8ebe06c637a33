"""Programs that read a run's outputs while the run writes them (found by a hunt; each test
failed before its fix): a dashboard connected to the `--sink sqlite` results while the run
ends, then the next cron step copying the results file; a program holding a write
transaction on the results file as a run starts."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, run_args, write_csv


async def test_a_sqlite_results_file_is_whole_after_a_run_a_reader_was_connected_to(
    tmp_path: Path,
) -> None:
    """A reader connected to the results (a dashboard polling the table) when the run closed
    them kept every row in `r.db-wal`, not in `r.db`: the next cron step copying `r.db` (to the
    warehouse, an archive) got a file with no results table at all, after an exit 0."""
    manifest = write_csv(tmp_path / "m.csv", 400)
    out = tmp_path / "r.db"
    async with running_service(ServiceConfig(rate=300.0)) as svc:
        run = subprocess.Popen(
            run_args(svc.url, out, str(manifest), "--sink", "sqlite"),
            env=ENV,
            stderr=subprocess.PIPE,
        )
        try:
            while not out.exists() and run.poll() is None:
                await anyio.sleep(0.05)
            reader = sqlite3.connect(out)
            try:
                while run.poll() is None:
                    reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
                    await anyio.sleep(0.1)
                assert run.wait() == 0, run.stderr.read().decode()[-400:] if run.stderr else ""
                shutil.copyfile(out, tmp_path / "copy.db")  # the reader still connected
            finally:
                reader.close()
        finally:
            if run.poll() is None:
                run.kill()
            run.wait()
            if run.stderr:
                run.stderr.close()
    with sqlite3.connect(tmp_path / "copy.db") as copy:
        tables = {r[0] for r in copy.execute("SELECT name FROM sqlite_master")}
        assert "results" in tables, "the results are in r.db-wal only"
        assert copy.execute("SELECT count(*) FROM results").fetchone() == (400,)


async def test_a_sqlite_results_file_locked_by_another_program_as_a_run_starts_is_named(
    tmp_path: Path,
) -> None:
    """Another program holding a write transaction on the results file (a dashboard adding a
    table of its own) as the next night's run started: the run stopped saying
    ``OperationalError: database is locked``, naming no file, while the state beside it is an
    SQLite database too. It names the results file, as a write locked mid-run does."""
    out = tmp_path / "r.db"
    async with running_service(ServiceConfig()) as svc:
        first = await anyio.run_process(
            run_args(svc.url, out, str(write_csv(tmp_path / "m.csv", 50)), "--sink", "sqlite"),
            env=ENV,
            check=False,
        )
        assert first.returncode == 0, first.stderr.decode()[-400:]
        holder = sqlite3.connect(out, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            holder.execute("CREATE TABLE mine (x)")
            second = await anyio.run_process(
                run_args(svc.url, out, str(write_csv(tmp_path / "n.csv", 60)), "--sink", "sqlite"),
                env=ENV,
                check=False,
            )
        finally:
            holder.close()
    err = second.stderr.decode()
    assert second.returncode == 1, err[-400:]
    assert "database is locked" in err and str(out) in err, err[-400:]
    assert "Traceback" not in err
