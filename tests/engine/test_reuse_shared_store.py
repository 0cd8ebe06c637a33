"""A result store shared by runs at the same moment: two cron jobs (or daemons) that open a
store nobody has created yet, and two that store the same products at once in PostgreSQL.

Both broke a run that had done nothing wrong:

* Two runs opening a missing SQLite store at once: the second read the store's application id
  before the first committed its schema and its version after, and refused the store the first
  had just made ("... is not a fashiontag result store (SQLite application id 0x0)"), exit 1.
* Two runs storing results of the same fingerprints in PostgreSQL in another order (two
  catalogues listing the same products in another order; a commit takes several pages): each
  statement locked its rows in its own order, PostgreSQL found a deadlock and aborted one, and
  that run stopped ("result store ... cannot be used: deadlock detected").
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.engine.reuse import ResultStore, open_store
from fashiontag_pipeline.engine.reuse.store import APPLICATION_ID

RESULT = b'{"status":"success","data":{"objects":[]}}'


class _OtherRunOpensMeanwhile:
    """The writer connection of a store being opened, which lets another run open (create)
    the same store between this one's first and second look at the file's header: the moment
    two cron jobs started on the same minute, on the first night, fall into by chance."""

    def __init__(self, db: sqlite3.Connection, other: Any) -> None:
        self._db = db
        self._other = other

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "PRAGMA user_version" and self._other is not None:
            other, self._other = self._other, None
            other.start()
            other.join(2.0)  # done, or waiting for this opener's lock
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_two_runs_creating_a_missing_store_at_once_both_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "reuse.db"
    opened: list[ResultStore] = []
    errors: list[BaseException] = []

    def other_run() -> None:
        try:
            opened.append(ResultStore.open(path))
        except BaseException as err:  # pragma: no cover - what the test reports
            errors.append(err)

    other = threading.Thread(target=other_run)
    real_connect = ResultStore._connect
    first = [True]

    def connect(p: Path) -> Any:
        db = real_connect(p)
        if first[0]:  # this run's writer: the other run opens meanwhile
            first[0] = False
            return _OtherRunOpensMeanwhile(db, other)
        return db

    monkeypatch.setattr(ResultStore, "_connect", staticmethod(connect))
    try:
        mine = ResultStore.open(path)
    finally:
        other.join(60)
    assert errors == []
    mine.put([(b"a" * 16, "t1", RESULT)], stored_at=1.0)
    opened[0].put([(b"b" * 16, "t2", RESULT)], stored_at=1.0)
    assert set(mine.lookup([b"a" * 16, b"b" * 16], newer_than=0.0)) == {b"a" * 16, b"b" * 16}
    mine.close()
    opened[0].close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_foreign_sqlite_file_is_still_refused_and_left_alone(tmp_path: Path) -> None:
    """(What the fix above must keep: a file that is not a store is never taken over.)"""
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(Exception, match="not a fashiontag result store"):
        ResultStore.open(path)
    assert path.read_bytes() == before


def test_two_runs_storing_the_same_products_in_postgresql_never_deadlock(
    postgres_url: str,
) -> None:
    """Two runs (daemons, cron jobs) store results of the same fingerprints at the same moment,
    one in the other's reverse order: both succeed (no ``deadlock detected`` stopping a run)."""
    mine, theirs = open_store(postgres_url), open_store(postgres_url)
    errors: list[str] = []
    try:
        for night in range(3):
            rows = [(os.urandom(16), f"t{night}", RESULT) for _ in range(10_000)]

            def store(into: Any, part: list[tuple[bytes, str, bytes]], at: float) -> None:
                try:
                    into.put(part, stored_at=at)
                except Exception as err:
                    errors.append(str(err))

            threads = [
                threading.Thread(target=store, args=(mine, rows, 1.0 + night)),
                threading.Thread(target=store, args=(theirs, rows[::-1], 2.0 + night)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            found = mine.lookup([fp for fp, _, _ in rows], newer_than=0.0)
            assert len(found) == len(rows)
    finally:
        mine.close()
        theirs.close()
    assert errors == []


@pytest.mark.parametrize(
    "action", [["stats"], ["stats", "--json"], ["prune", "--older-than", "30d"]]
)
def test_reuse_stats_of_an_unused_postgresql_store_writes_nothing(
    postgres_url: str, action: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``reuse stats`` (or ``prune``) on a PostgreSQL URL no run has used created the
    store's schema (every table of the state and the result store) before saying it "holds
    nothing yet": reading the figures wrote to a database, perhaps a production one."""
    import psycopg

    from fashiontag_pipeline.cli.commands import main

    tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    code = main(["reuse", action[0], postgres_url, *action[1:]])
    assert code == 1
    assert "holds nothing yet" in capsys.readouterr().err
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(tables).fetchone() == (0,)
    # A store a run has used reads as before.
    open_store(postgres_url).close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(tables).fetchone() != (0,)


@pytest.mark.parametrize("as_json", [False, True])
def test_reuse_stats_with_a_read_only_postgresql_role_reads_the_figures(
    postgres_url: str, as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The nightly runs' store in PostgreSQL, its figures read by a monitoring job with a
    role that may only read (``GRANT SELECT``, the usual account for dashboards): ``reuse
    stats`` said ``cannot be used: permission denied for schema ...`` (exit 1), since opening
    the store ran the schema's migrations, DDL included, even to read it. A store whose schema
    is current is read as it is; the role's ``stats`` shows the figures and writes nothing."""
    import psycopg

    from fashiontag_pipeline.cli.commands import main

    store = open_store(postgres_url)
    store.put([(b"a" * 16, "t1", RESULT), (b"b" * 16, "t1", RESULT)], stored_at=1.0e9)
    store.record_run(started_at=1.0e9, finished_at=1.0e9 + 5, looked_up=4, reused=2, stored=2)
    store.close()
    schema = postgres_url.rsplit("%3D", 1)[1]
    role = f"watcher_{schema}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
    reader = postgres_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    code = main(["reuse", "stats", reader, *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    if as_json:
        figures = json.loads(out)
        assert figures["rows"] == 2 and figures["last_run"]["hit_rate"] == 0.5, figures
    else:
        assert "rows 2" in out and "hit rate 50.0%" in out, out


def _role_on_store(postgres_url: str, name: str, *grants: str) -> str:
    """A login role on the schema of ``postgres_url`` given ``grants`` (``{schema}`` and
    ``{role}`` filled in); the URL its runs give."""
    import psycopg

    schema = postgres_url.rsplit("%3D", 1)[1]
    role = f"{name}_{schema}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        for grant in grants:
            conn.execute(grant.format(schema=schema, role=role))
    return postgres_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


async def _tag(tmp_path: Path, reuse: str, n: int) -> tuple[int, str, list[str]]:
    """``fashiontag run --reuse REUSE`` of ``n`` rows (its state a file): exit code, stderr,
    the ids the service was sent."""
    import anyio

    from fashiontag_pipeline.service import ServiceConfig, running_service

    from .helpers import ENV, run_args, write_csv

    tmp_path.mkdir(exist_ok=True)
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = [*run_args(svc.url, out, str(manifest)), "--state", str(tmp_path / "s.state")]
        done = await anyio.run_process([*args, "--reuse", reuse], check=False, env=ENV)
        sent = [i for record in svc.store.tasks.values() for i in record.ids]
    return done.returncode, done.stderr.decode(), sent


_DML = 'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'


async def test_a_store_made_by_its_owner_is_used_by_a_role_granted_its_rows(
    tmp_path: Path, postgres_url: str
) -> None:
    """A DBA's least-privilege deployment: the shared store made once by the schema's owner,
    the team's nightly role granted SELECT, INSERT, UPDATE and DELETE on its tables, no CREATE.
    Every run of that role stopped at its start, exit 1, with ``cannot be used: permission
    denied for schema ...`` (the migrations' DDL ran even on a current schema), pushing the
    DBA to grant CREATE. A current schema is used as it is: the role tags and stores, and the
    next night reuses what it stored."""
    open_store(postgres_url).close()  # (made by the owner: the schema is current)
    url = _role_on_store(postgres_url, "nightly", _DML)
    code, err, sent = await _tag(tmp_path / "first", url, 5)
    assert code == 0 and len(sent) == 5, err[-800:]
    code, err, sent = await _tag(tmp_path / "second", url, 5)
    assert code == 0 and sent == [], err[-800:]
    assert "reused 5" in err, err[-800:]


async def test_a_store_on_a_read_only_database_stops_the_run_before_anything_is_sent(
    tmp_path: Path, postgres_url: str
) -> None:
    """A store whose database only reads (a hot standby after a failover, a role or database
    with ``default_transaction_read_only = on``): the run could look results up but store
    none, so it stops at its start (exit 1, nothing sent), saying the database is read-only."""
    open_store(postgres_url).close()
    url = _role_on_store(
        postgres_url, "standby", _DML, 'ALTER ROLE "{role}" SET default_transaction_read_only = on'
    )
    code, err, sent = await _tag(tmp_path, url, 5)
    assert code == 1 and sent == [], err[-800:]
    assert "read-only" in err and "Traceback" not in err, err[-800:]
