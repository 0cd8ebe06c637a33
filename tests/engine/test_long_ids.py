"""Ids longer than a state store can key (each test failed before its fix): the row is one
reject saying so, never a run that fails on it every night."""

from __future__ import annotations

import json
import secrets
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, dead_port, run_args, run_piped, write_csv


def _long(n: int) -> str:
    """``n`` characters no compression shortens (a signed URL's token, a hash chain)."""
    return secrets.token_urlsafe(n)[:n]


async def test_an_id_too_long_to_key_is_one_reject_on_either_state(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """A manifest row whose id is ~3 KB (a URL list's signed URL, an id column holding a
    description): with a PostgreSQL state, the run failed on writing it ("index row size
    exceeds btree version 4 maximum 2704"), nothing written, and failed the same on every
    run again. Now such an id is a client reject with that reason, on either state."""
    long_url = "https://cdn.example/img.jpg?sig=" + _long(3000)
    emoji = "\U0001f600" * 600  # 600 characters, 2,400 bytes
    urls = tmp_path / "list.txt"
    urls.write_text(f"https://cdn.example/a.jpg\n{long_url}\nhttps://cdn.example/b.jpg\n")
    plain = tmp_path / "plain.csv"
    plain.write_text(
        f"id,url\nc1,https://x.example/1.jpg\n{_long(2900)}x,https://x.example/2.jpg\n"
    )
    context = tmp_path / "context.csv"
    context.write_text(
        "id,url,brand\n"
        "k1,https://x.example/k1.jpg,B\n"
        f"{emoji},https://x.example/k2.jpg,B\n"
        f"{_long(2800)}y,https://x.example/k3.jpg,B,extra field\n"
        "k4,https://x.example/k4.jpg,B\n"
    )
    jsonl = tmp_path / "rows.jsonl"
    long_j1, long_j2 = _long(2800) + "j", _long(2700) + "z"
    jsonl.write_text(
        json.dumps({"id": "j1", "url": "https://x.example/j1.jpg"})
        + "\n"
        + json.dumps({"id": long_j1, "url": "https://x.example/j2.jpg"})
        + "\n"
        + json.dumps({"context": {"id": long_j2, "brand": "B"}, "url": "https://x.example/j3.jpg"})
        + "\n"
    )
    manifests = [urls, plain, context, jsonl]
    out = tmp_path / "out.jsonl"
    state = state_location("long")
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), *map(str, manifests))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    short = {"https://cdn.example/a.jpg", "https://cdn.example/b.jpg", "c1", "k1", "k4", "j1"}
    rejects = [json.loads(line) for line in out.with_suffix(".rej").read_text().splitlines()]
    too_long = {r["id"] for r in rejects}
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), short | too_long)
    assert {r["id"] for r in outcomes.results} == short
    assert long_url in too_long and emoji in too_long and {long_j1, long_j2} <= too_long
    assert len(rejects) == 6
    for r in rejects:
        if r["reason"].startswith("row has"):
            continue  # (the row with a field too many: that is its reason)
        assert r["stage"] == "client" and "2048 bytes" in r["reason"], r


#: ``fashiontag run`` as a build before the id limit ran it (2026-11-27: an id of any length
#: was taken in, and a SQLite state keyed it).
BEFORE_THE_LIMIT = (
    "import sys\n"
    "from fashiontag_pipeline.engine import plainblock, rules\n"
    "rules.MAX_ID_SAFE_CHARS = plainblock.MAX_ID_SAFE_CHARS = 1 << 40\n"
    "from fashiontag_pipeline.cli import main\n"
    "sys.argv[0] = 'fashiontag'\n"
    "sys.exit(main())\n"
)


async def test_a_long_id_taken_in_by_an_earlier_build_gets_its_reject_on_resume(
    tmp_path: Path,
) -> None:
    """A build before the limit took a ~3 KB id in (a SQLite state keys it) and stopped
    before the row went into a chunk (the service unreachable: rows validated, V, run ahead
    of the chunks written, W). This build, resuming, refused the row as too long but wrote
    no reject for it (a row at or below V had its reject written, it took for granted), nor
    sent it: 'run incomplete: 1 rows have no outcome', exit 3 on every run again. Now the
    row gets its reject on the resume, and the run completes."""
    long_id = _long(3000)
    manifest = tmp_path / "m.csv"
    with manifest.open("w") as fh:
        fh.write("id,url\n")
        for i in range(30_000):
            if i == 12_000:
                fh.write(f"{long_id},https://x.example/long.jpg\n")
            fh.write(f"a{i},https://x.example/{i}.jpg\n")
    out, state = tmp_path / "out.jsonl", tmp_path / "run.state"
    dead = f"http://127.0.0.1:{dead_port()}"
    old = run_args(dead, out, "--state", str(state), "--give-up-after", "1", str(manifest))
    first = await anyio.run_process(
        [sys.executable, "-c", BEFORE_THE_LIMIT, *old[3:]], check=False, env=ENV
    )
    assert first.returncode == 1, first.stderr.decode()
    db = sqlite3.connect(state)
    try:
        ((validated, chunked),) = db.execute("SELECT validated, chunked FROM jobs")
        assert db.execute("SELECT pos FROM ids WHERE id = ?", (long_id,)).fetchone() is not None
    finally:
        db.close()
    assert chunked < 12_001 < validated  # (the row was taken in, not chunked)
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), str(manifest))
        resumed = await anyio.run_process(args, check=False, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    ids = {f"a{i}" for i in range(30_000)} | {long_id}
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), ids)
    (reject,) = outcomes.rejects
    assert reject["id"] == long_id and "2048 bytes" in reject["reason"], reject["reason"]


async def test_a_stdin_resume_of_a_long_id_an_earlier_build_took_in_is_taken(
    tmp_path: Path,
) -> None:
    """The same, piped on stdin (``run - --resume``): the resume refused the dump as 'stdin
    does not carry the rows of the run being resumed: line N has no usable id, where that
    run read one', though the same rows were piped again. Now the row's id, taken in at that
    very line, is its row's: the resume goes on and the row gets its reject."""
    long_id = _long(3000)
    dump = tmp_path / "dump.csv"
    with dump.open("w") as fh:
        fh.write("id,url\n")
        for i in range(30_000):
            if i == 12_000:
                fh.write(f"{long_id},https://x.example/long.jpg\n")
            fh.write(f"a{i},https://x.example/{i}.jpg\n")
    out = tmp_path / "out.jsonl"
    dead = f"http://127.0.0.1:{dead_port()}"
    old = run_args(dead, out, "--give-up-after", "1", "-")
    first = await run_piped([sys.executable, "-c", BEFORE_THE_LIMIT, *old[3:]], dump)
    assert first.returncode == 1, first.stderr.decode()
    async with running_service(ServiceConfig(fetch=False)) as svc:
        resumed = await run_piped([*run_args(svc.url, out, "-"), "--resume"], dump)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    ids = {f"a{i}" for i in range(30_000)} | {long_id}
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), ids)
    (reject,) = outcomes.rejects
    assert reject["id"] == long_id and "2048 bytes" in reject["reason"], reject["reason"]


#: The newest state each build before the id limit reads (2026-11-27): a SQLite file's
#: ``user_version`` and a PostgreSQL state's ``states.version``; a newer one it refuses,
#: saying to upgrade fashiontag.
BEFORE_THE_LIMIT_READS = {"sqlite": 2, "postgresql": 1}


def _state_version(state: Path | str) -> int:
    if isinstance(state, Path):
        db = sqlite3.connect(state)
        try:
            return int(db.execute("PRAGMA user_version").fetchone()[0])
        finally:
            db.close()
    import psycopg

    base, _, name = state.partition("#")
    with psycopg.connect(base) as conn:
        rows = conn.execute("SELECT name, version FROM states").fetchall()
    (version,) = [v for schema, v in rows if schema.endswith(f"_{name}")]
    return int(version)


async def test_a_state_holding_a_long_id_s_reject_is_refused_by_a_build_before_the_limit(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """A deploy put back (the night's run stopped: the service down) left a state holding the
    reject of a ~3 KB id in the window a resume reads again (V ahead of W), which a build
    before the limit misread: it took the id in again (no store held it), sent it and wrote
    it a second reject, then called the state damaged (exit 3, '--restart starts over': every
    row billed again); with that reject the last line of the rejects, it refused the file as
    another run's, advising --restart too (a daemon failed the manifest). Now such a state is
    marked a version newer, which those builds refuse ('upgrade fashiontag') before reading
    anything; a state without such a reject keeps its version (a rollback takes it), and
    this build resumes the marked one as ever."""
    long_id = _long(3000)
    manifest = tmp_path / "m.csv"
    with manifest.open("w") as fh:
        fh.write("id,url\n")
        for i in range(30_000):
            if i == 12_000:
                fh.write(f"{long_id},https://x.example/long.jpg\n")
            fh.write(f"a{i},https://x.example/{i}.jpg\n")
    plain = write_csv(tmp_path / "plain.csv", 300)
    backend = "sqlite" if isinstance(state_location("x"), Path) else "postgresql"
    reads = BEFORE_THE_LIMIT_READS[backend]
    out, state, other = tmp_path / "out.jsonl", state_location("long"), state_location("plain")
    dead = f"http://127.0.0.1:{dead_port()}"
    for path, where, to in ((manifest, state, out), (plain, other, tmp_path / "plain.jsonl")):
        args = run_args(dead, to, "--state", str(where))
        stopped = await anyio.run_process(
            [*args, "--give-up-after", "1", str(path)], check=False, env=ENV
        )
        assert stopped.returncode == 1, stopped.stderr.decode()
    assert _state_version(state) > reads  # (refused by those builds)
    assert _state_version(other) == reads  # (taken by them: a rollback works)
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), str(manifest))
        resumed = await anyio.run_process(args, check=False, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    ids = {f"a{i}" for i in range(30_000)} | {long_id}
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), ids)
    (reject,) = outcomes.rejects
    assert reject["id"] == long_id and "2048 bytes" in reject["reason"], reject["reason"]
    assert _state_version(state) == reads  # (a completed run: none misreads it)
