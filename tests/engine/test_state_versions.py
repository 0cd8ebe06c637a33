"""A SQLite state file and the fashiontag that wrote it: the file carries the version of its
layout (``PRAGMA user_version``), a file of a newer layout is refused before anything is read
or written, and a file of every build before the version was kept (0) is taken and marked.

Why it matters: a build before 2026-11-23 04:00 (no ``jobs`` table, its watermarks in ``meta``)
resuming a state file a newer build had written cut the results file back to a checkpoint it
misread (3,000 committed lines -> 400), then died on ``OperationalError: table chunk_bodies has
3 columns but 2 values were supplied``; the newer build, put back, could only ``--restart``
(every row billed again). The layouts never had a version, so no build could tell."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline import StateError
from fashiontag_pipeline.engine.state import STATE_FILE_BASE, STATE_FILE_VERSION, StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, read_outcomes, run_args, write_csv
from .proxy import BULK, Misbehaviour, misbehaving


def _version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def _mark(path: Path, version: int) -> None:
    """What a newer fashiontag leaves: its layout's version in the file's header."""
    db = sqlite3.connect(path)
    try:
        db.execute(f"PRAGMA user_version = {version}")
    finally:
        db.close()


async def test_a_state_file_of_a_newer_fashiontag_is_refused_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    state = tmp_path / "nightly.state"
    tonight = write_csv(tmp_path / "tonight.csv", 300, start=1000)
    async with running_service(ServiceConfig()) as svc:
        last_night = write_csv(tmp_path / "last.csv", 200)
        first = await anyio.run_process(
            run_args(svc.url, out, str(last_night), "--state", str(state)), check=False, env=ENV
        )
        assert first.returncode == 0, first.stderr.decode()
        assert _version(state) == STATE_FILE_BASE
        _mark(state, STATE_FILE_VERSION + 1)  # (a newer build ran on it, and was put back)
        results = out.read_bytes()
        again = await anyio.run_process(
            run_args(svc.url, out, str(tonight), "--state", str(state)), check=False, env=ENV
        )
    err = again.stderr.decode()
    assert again.returncode == 1, err
    assert f"state file {state}" in err and f"version {STATE_FILE_VERSION + 1}" in err, err
    assert "upgrade fashiontag" in err, err
    assert out.read_bytes() == results  # never rewritten for a run it could not read
    assert len(read_outcomes(out, out.with_suffix(".rej")).results) == 200
    assert _version(state) == STATE_FILE_VERSION + 1


def test_a_daemon_state_file_of_a_newer_layout_is_refused_untouched(tmp_path: Path) -> None:
    """The daemon's state (engine tables and claims, one file) is opened the same way: a
    newer layout (here a file with only its ``meta``) gets none of this build's tables."""
    path = tmp_path / "daemon.state"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(f"PRAGMA user_version = {STATE_FILE_VERSION + 3}")
    db.close()
    with pytest.raises(StateError, match=r"upgrade fashiontag") as caught:
        StateDB(path)
    assert str(path) in str(caught.value)
    db = sqlite3.connect(path)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    assert tables == {"meta"}
    _mark(path, STATE_FILE_VERSION)
    StateDB(path).close()  # (the refused open let its lock go)


def test_a_state_file_of_every_build_before_versions_is_taken_and_marked(tmp_path: Path) -> None:
    """A file written before the version was kept (user_version 0: every build up to
    2026-11-26) is of this layout or an older one this build migrates: it is opened as ever,
    its run kept, and marked with the version of its layout (a file holding no long id's reject)."""
    path = tmp_path / "old.state"
    db = StateDB(path)
    try:
        db.set_meta("run_token", "0123456789abcdef")
    finally:
        db.close()
    _mark(path, 0)
    db = StateDB(path)
    try:
        assert db.meta("run_token") == "0123456789abcdef"
    finally:
        db.close()
    assert _version(path) == STATE_FILE_BASE


async def test_an_orphan_counted_by_an_older_build_is_not_counted_again(tmp_path: Path) -> None:
    """Every append answered 204 (applied, no body): its rows count as submitted in the commit
    that makes the chunk an orphan. A build before 2026-11-26 23:55 left ``n_ok`` NULL there;
    this one takes NULL for "none counted yet" and counts them again when the task returns
    them. A run killed then, resumed by this build, said ``submitted 5,000`` of 3,000 rows
    (3,000 billed). An orphan of such a file is taken as counted whole."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "s.db"
    summary = tmp_path / "summary.json"
    extra = ["--state", str(state), "--summary", str(summary), "--rotate-min-images", "5000"]
    extra += ["--rotate-images", "5000"]
    async with running_service(ServiceConfig()) as svc:
        proc: anyio.abc.Process | None = None

        def kill_at_first_page(method: str, path: str) -> None:
            page = method == "GET" and path.startswith(f"{BULK}/") and not path.endswith("/status")
            if page and proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGKILL)

        rules = Misbehaviour(no_content_writes={"PUT"}, on_request=kill_at_first_page)
        async with misbehaving(svc.url, rules) as proxy:
            proc = await anyio.open_process(
                run_args(proxy.url, out, str(manifest), *extra), env=ENV
            )
            with anyio.fail_after(30):
                await proc.wait()
            await proc.aclose()
        assert proc.returncode == -signal.SIGKILL
        with sqlite3.connect(state) as db:  # what a build before the count left
            (orphans,) = db.execute("SELECT count(*) FROM chunks WHERE state='orphan'").fetchone()
            db.execute("UPDATE chunks SET n_ok = NULL WHERE state='orphan'")
            db.execute("DELETE FROM meta WHERE key = 'orphans_counted'")
        assert orphans >= 1  # (every append: 2 with chunks of 1,000)
        final = await anyio.run_process(
            run_args(svc.url, out, str(manifest), *extra), check=False, env=ENV
        )
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    assert len(read_outcomes(out, out.with_suffix(".rej")).results) == n
    figures = msgspec.json.decode(summary.read_bytes())
    assert (figures["submitted"], billed) == (n, n)


@pytest.mark.parametrize("dropped", [("pages", "tasks"), ("tasks",)], ids=["both", "half"])
async def test_a_state_file_of_the_first_builds_with_jobs_is_resumed(
    tmp_path: Path, dropped: tuple[str, ...]
) -> None:
    """Builds of 2026-11-23 03:56 to 04:46 (the first with the ``jobs`` table: the first
    ``fashiontag daemon``) wrote it without ``pages`` and ``tasks``. A run (or a daemon)
    killed under such a build and resumed by this one stopped at once on
    ``OperationalError: ... no such column: pages`` (``the same command resumes once this is
    fixed``: it never did), its rows' results never read; the daemon stopped with its
    manifests in ``.work``. The columns are added as the file is opened, each one that is
    missing (``half``: a crash or a full disk between the two ALTERs, each its own commit,
    left ``pages`` without ``tasks``, and every open failed on it)."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "s.db"
    extra = ["--state", str(state)]
    async with running_service(ServiceConfig()) as svc:
        proc: anyio.abc.Process | None = None

        def kill_at_first_page(method: str, path: str) -> None:
            page = method == "GET" and path.startswith(f"{BULK}/") and not path.endswith("/status")
            if page and proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGKILL)

        async with misbehaving(svc.url, Misbehaviour(on_request=kill_at_first_page)) as proxy:
            proc = await anyio.open_process(
                run_args(proxy.url, out, str(manifest), *extra), env=ENV
            )
            with anyio.fail_after(30):
                await proc.wait()
            await proc.aclose()
        assert proc.returncode == -signal.SIGKILL
        with sqlite3.connect(state) as db:  # the jobs table as those builds made it
            for column in dropped:
                db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
            db.execute("PRAGMA user_version = 0")
        final = await anyio.run_process(
            run_args(svc.url, out, str(manifest), *extra), check=False, env=ENV
        )
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(r["id"] for r in outcomes.results) == sorted(f"p{i}" for i in range(n))
    assert billed == n


def _committed(state: Path) -> int:
    """The results the run's state counts written (0 while it cannot be read)."""
    try:
        with sqlite3.connect(state) as db:
            row = db.execute("SELECT results_ckpt FROM jobs").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0]) if row else 0


def _as_before_jobs(state: Path) -> None:
    """The state of ``run`` as builds before the ``jobs`` table (2026-11-23, before 03:56)
    kept it: the run's watermarks, checkpoints and counters in ``meta``, its manifests' names
    there, its output paths and its sink nowhere."""
    with sqlite3.connect(state) as db:
        names, *marks = db.execute(
            "SELECT sources, validated, chunked, results_ckpt, rejects_ckpt FROM jobs"
        ).fetchone()
        keys = ("validated", "chunked", "results_ckpt", "rejects_ckpt")
        rows = list(zip(keys, marks, strict=True))
        rows.append(("manifests", msgspec.json.encode([n for _, n in msgspec.json.decode(names)])))
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)
        db.execute("DELETE FROM jobs")
        db.execute("DELETE FROM job_tasks")
        db.execute("PRAGMA user_version = 0")


async def test_a_sqlite_sink_run_of_a_build_before_jobs_is_resumed_with_its_sink(
    tmp_path: Path,
) -> None:
    """A ``--sink sqlite`` run killed under a build before the ``jobs`` table, which did not
    record its sink, and resumed by this one with the same command, was refused (exit 2:
    ``begun with --sink jsonl, whose results so far are in  in that format ... resume it
    with --sink jsonl``); with --sink jsonl it was refused again (exit 1, the SQLite file
    ``does not end ... with a line of this run``): only --restart, every row billed again.
    Such a job's sink is unknown: the one given now is taken (the sinks refuse a file of
    the other kind)."""
    n = 6000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.db"
    state = tmp_path / "s.db"
    extra = ["--state", str(state), "--sink", "sqlite"]
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        proc = await anyio.open_process(run_args(svc.url, out, str(manifest), *extra), env=ENV)
        with anyio.fail_after(30):  # killed once some results are committed
            while _committed(state) == 0:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        _as_before_jobs(state)
        final = await anyio.run_process(
            run_args(svc.url, out, str(manifest), *extra), check=False, env=ENV
        )
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    with sqlite3.connect(out) as db:
        ids = [i for (i,) in db.execute("SELECT id FROM results")]
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))
    assert billed == n


async def test_a_jsonl_run_of_a_build_before_jobs_given_the_wrong_sink_is_resumed_with_its_own(
    tmp_path: Path,
) -> None:
    """The reverse of the above: a JSONL run killed under a build before ``jobs`` and resumed
    by mistake with ``--sink sqlite`` is refused (its results file is not a database), and the
    same command with the sink it was begun with then resumes it: the refused attempt must not
    record the wrong sink as the run's (which refused every resume, ``--restart`` left only)."""
    n = 6000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    state = tmp_path / "s.db"
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        proc = await anyio.open_process(args, env=ENV)
        with anyio.fail_after(30):  # killed once some results are committed
            while _committed(state) == 0:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        _as_before_jobs(state)
        before = out.read_bytes()
        wrong = await anyio.run_process([*args, "--sink", "sqlite"], check=False, env=ENV)
        assert wrong.returncode == 2, wrong.stderr.decode()
        assert b"resume it with --sink jsonl" in wrong.stderr
        assert out.read_bytes() == before
        final = await anyio.run_process(args, check=False, env=ENV)
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(r["id"] for r in outcomes.results) == sorted(f"p{i}" for i in range(n))
    assert billed == n


async def test_a_sqlite_run_of_a_build_before_jobs_given_no_sink_is_resumed_with_its_own(
    tmp_path: Path,
) -> None:
    """A ``--sink sqlite`` run killed under a build before ``jobs``, resumed by mistake
    without ``--sink`` (jsonl): refused, and the command with ``--sink sqlite`` then resumes
    it (the refused attempt must not record jsonl and its path as the run's)."""
    n = 6000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.db"
    state = tmp_path / "s.db"
    async with running_service(ServiceConfig(rate=3000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        proc = await anyio.open_process([*args, "--sink", "sqlite"], env=ENV)
        with anyio.fail_after(30):  # killed once some results are committed
            while _committed(state) == 0:
                await anyio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        _as_before_jobs(state)
        wrong = await anyio.run_process(args, check=False, env=ENV)
        assert wrong.returncode != 0
        final = await anyio.run_process([*args, "--sink", "sqlite"], check=False, env=ENV)
        billed = svc.store.image_count
    assert final.returncode == 0, final.stderr.decode()
    with sqlite3.connect(out) as db:
        ids = [i for (i,) in db.execute("SELECT id FROM results")]
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))
    assert billed == n
