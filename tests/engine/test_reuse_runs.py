"""--reuse end to end against the reference service on loopback: the service's own task
records say which rows it was asked to tag."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline import ResultStoreError, StateConflictError
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.analyzer import Analysis, ImageRejected, ReferenceAnalyzer
from fashiontag_pipeline.service.app import RunningService

from .helpers import (
    ENV,
    assert_exactly_once,
    client_config,
    read_outcomes,
    run_args,
    short_deadline,
)

DAY = 86_400.0


class _FailsBadUrls(ReferenceAnalyzer):
    """Tags from the URL text; ``/bad/`` URLs fail (803), so a run has failure results."""

    async def from_url(self, url: str) -> Analysis:
        if "/bad/" in url:
            raise ImageRejected(803, "image URL could not be fetched")
        return self.from_text(url)


def _service() -> ServiceConfig:
    return ServiceConfig(fetch=True, analyzer=_FailsBadUrls())


def _engine(store: Path, **kwargs: Any) -> EngineConfig:
    return EngineConfig(
        poll_min=0.02,
        poll_max=0.2,
        linger_seconds=0.2,
        fsync_seconds=10.0,
        rotate_min_images=50,
        reuse=str(store),
        **kwargs,
    )


def _write(path: Path, rows: Iterable[tuple[str, str, str, str]]) -> Path:
    lines = ["id,url,brand,detection", *(",".join(r) for r in rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _asked(svc: RunningService, before: set[str]) -> list[str]:
    """Ids of every image the service was asked to tag in tasks created after ``before``."""
    return [i for tid, t in svc.store.tasks.items() if tid not in before for i in t.ids]


def _night1() -> list[tuple[str, str, str, str]]:
    rows = [(f"p{i}", f"https://img.example/{i}.jpg", "acme", "TOP|SHOES") for i in range(60)]
    rows[5] = ("p5", "https://img.example/bad/5.jpg", "acme", "TOP")  # fails: not stored
    return rows


async def test_two_nights_changed_renamed_new_gone(tmp_path: Path) -> None:
    store = tmp_path / "reuse.db"
    night1 = _write(tmp_path / "night1.csv", _night1())
    rows = {r[0]: r for r in _night1()}
    rows["p1"] = ("p1", "https://img.example/1-new.jpg", "acme", "TOP|SHOES")  # new image
    rows["p2"] = ("p2", "https://img.example/2.jpg", "acme", "TOP")  # detection changed
    rows["p3"] = ("p3", "https://img.example/3.jpg", "other", "TOP|SHOES")  # context changed
    rows["p6"] = ("p6", "https://img.example/6.jpg", "acme", "SHOES|TOP")  # same set: reused
    rows["q4"] = (*("q4",), *rows.pop("p4")[1:])  # renamed: new id, same image and context
    del rows["p10"], rows["p11"]  # gone
    rows["n0"] = ("n0", "https://img.example/new0.jpg", "acme", "")  # new
    rows["n1"] = ("n1", "https://img.example/new1.jpg", "acme", "BAG")  # new
    night2 = _write(tmp_path / "night2.csv", rows.values())
    out1, out2 = tmp_path / "n1.jsonl", tmp_path / "n2.jsonl"
    async with running_service(_service()) as svc:
        first = await run_pipeline(
            [night1],
            client=client_config(svc.url),
            out=out1,
            rejects=tmp_path / "n1.rej",
            engine=_engine(store),
        )
        assert first.complete and first.reused == 0
        assert sorted(_asked(svc, set())) == sorted(r[0] for r in _night1())
        before = set(svc.store.tasks)
        second = await run_pipeline(
            [night2],
            client=client_config(svc.url),
            out=out2,
            rejects=tmp_path / "n2.rej",
            engine=_engine(store),
        )
        asked = _asked(svc, before)
    # Only new or changed rows, and the earlier failure, reached the service.
    assert sorted(asked) == ["n0", "n1", "p1", "p2", "p3", "p5"]
    assert second.complete
    assert second.reused == len(rows) - 6 and second.submitted == 6
    assert second.tagged + second.failed == 6 and second.failed == 1
    o1 = read_outcomes(out1, tmp_path / "n1.rej")
    o2 = assert_exactly_once(out2, tmp_path / "n2.rej", set(rows))
    by_id1 = {r["id"]: r for r in o1.results}
    reused = {r["id"]: r for r in o2.results if r.get("reused")}
    assert set(reused) == set(rows) - {"n0", "n1", "p1", "p2", "p3", "p5"}
    # A reused line is the stored result, with the original task id and its own id.
    assert reused["q4"]["taskId"] == by_id1["p4"]["taskId"]
    assert reused["q4"]["taggingResult"] == by_id1["p4"]["taggingResult"]
    for ident in set(reused) - {"q4"}:
        assert reused[ident]["taskId"] == by_id1[ident]["taskId"]
        assert reused[ident]["taggingResult"] == by_id1[ident]["taggingResult"]
    # The store's record of the second night: what `reuse stats` shows as its hit rate.
    db = sqlite3.connect(store)
    last = db.execute("SELECT looked_up, reused, stored FROM runs ORDER BY run_id DESC").fetchone()
    rows_stored = db.execute("SELECT count(*) FROM results").fetchone()[0]
    db.close()
    assert last == (len(rows), len(rows) - 6, 5)
    assert rows_stored == 59 + 5  # night 1's successes, and night 2's five new questions


async def test_expired_results_are_sent_again(tmp_path: Path) -> None:
    store = tmp_path / "reuse.db"
    rows = [(f"p{i}", f"https://img.example/{i}.jpg", "acme", "") for i in range(40)]
    manifest = _write(tmp_path / "m.csv", rows)
    async with running_service(_service()) as svc:
        first = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=tmp_path / "a.jsonl",
            rejects=tmp_path / "a.rej",
            engine=_engine(store),
        )
        assert first.complete
        # Age ten of the stored results past the max age (no sleeping: their stored_at moves).
        db = sqlite3.connect(store)
        aged = db.execute(
            "UPDATE results SET stored_at = stored_at - ? WHERE rowid IN"
            " (SELECT rowid FROM results ORDER BY rowid LIMIT 10)",
            (31 * DAY,),
        ).rowcount
        db.commit()
        db.close()
        assert aged == 10
        before = set(svc.store.tasks)
        second = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=tmp_path / "b.jsonl",
            rejects=tmp_path / "b.rej",
            engine=_engine(store),
        )
        assert len(_asked(svc, before)) == 10 and second.reused == 30
        # A longer max age takes them all: nothing is sent.
        before = set(svc.store.tasks)
        db = sqlite3.connect(store)
        db.execute("UPDATE results SET stored_at = stored_at - ?", (40 * DAY,))
        db.commit()
        db.close()
        third = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=tmp_path / "c.jsonl",
            rejects=tmp_path / "c.rej",
            engine=_engine(store, reuse_max_age="60d"),
        )
        assert _asked(svc, before) == [] and third.reused == 40 and third.complete
    assert_exactly_once(tmp_path / "c.jsonl", tmp_path / "c.rej", {r[0] for r in rows})


async def test_corrupt_store_is_an_error_before_any_request(tmp_path: Path) -> None:
    store = tmp_path / "reuse.db"
    store.write_bytes(b"definitely not SQLite " * 300)
    manifest = _write(tmp_path / "m.csv", [("p0", "https://img.example/0.jpg", "acme", "")])
    async with running_service(_service()) as svc:
        with pytest.raises(ResultStoreError, match=str(store)):
            await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=tmp_path / "a.jsonl",
                rejects=tmp_path / "a.rej",
                engine=_engine(store),
            )
        assert svc.store.tasks == {}  # never a silent full re-tag
        # The CLI: exit 1, one line naming the file; a missing store is created, said on stderr.
        cli = await anyio.run_process(
            [*run_args(svc.url, tmp_path / "b.jsonl", str(manifest)), "--reuse", str(store)],
            check=False,
            env=ENV,
        )
        assert cli.returncode == 1 and str(store) in cli.stderr.decode()
        assert svc.store.tasks == {}
        fresh = tmp_path / "new" / "reuse.db"
        cli = await anyio.run_process(
            [*run_args(svc.url, tmp_path / "c.jsonl", str(manifest)), "--reuse", str(fresh)],
            check=False,
            env=ENV,
        )
    assert cli.returncode == 0, cli.stderr.decode()
    assert f"result store {fresh} did not exist: created it" in cli.stderr.decode()
    assert fresh.exists()


async def test_an_empty_store_file_is_said_to_be_empty_not_missing(tmp_path: Path) -> None:
    """A 0-byte ``--reuse`` file (truncated, ``touch``ed, a copy that failed) is taken as a
    new store, every row tagged (two runs may create one store at once, the second finding
    the first's empty file). The warning said the store "did not exist", which sent the user
    looking for a path error rather than for what emptied last night's store."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\np1,https://img.example/1.jpg\n")
    store = tmp_path / "reuse.db"
    store.write_bytes(b"")
    async with running_service(ServiceConfig()) as svc:
        cli = await anyio.run_process(
            [*run_args(svc.url, tmp_path / "a.jsonl", str(manifest)), "--reuse", str(store)],
            check=False,
            env=ENV,
        )
    err = cli.stderr.decode()
    assert cli.returncode == 0, err
    assert f"result store {store} was an empty file" in err and "did not exist" not in err, err


def _any_line(out: Path) -> bool:
    return out.exists() and b"\n" in out.read_bytes()


def _a_tagged_line(out: Path) -> bool:
    """A line written from a service result (not from the store)."""
    return out.exists() and any(b'"reused"' not in line for line in out.read_bytes().splitlines())


async def test_kill_9_mid_run_mixing_reused_and_sent_rows_then_resume(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """Nine rows in ten are in the store; the engine is killed (SIGKILL) once reused lines are
    out while the sent rows still linger in a partial chunk (so a resume replays reused rows:
    validated, never chunked), and again once tagged lines are out; then the same command
    finishes: every id once, and the service was never asked for a stored row. Run with the
    state and the store both in files, and both in PostgreSQL."""
    n = 6000
    where = state_location("run")
    store: Path | str = tmp_path / "reuse.db"
    if isinstance(where, str):  # PostgreSQL: the store in the same database
        store = where.partition("#")[0]
    known = tmp_path / "known.csv"
    known.write_text(
        "id,url\n" + "".join(f"p{i},https://img.example/{i}.jpg\n" for i in range(n) if i % 10)
    )
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "id,url\n" + "".join(f"p{i},https://img.example/{i}.jpg\n" for i in range(n))
    )
    out = tmp_path / "out.jsonl"
    state = where
    async with running_service(ServiceConfig(rate=1500.0)) as svc:
        seed = await anyio.run_process(
            [*run_args(svc.url, tmp_path / "seed.jsonl", str(known)), "--reuse", str(store)],
            check=False,
            env=ENV,
        )
        assert seed.returncode == 0, seed.stderr.decode()
        stats = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "reuse", "stats", str(store), "--json"],
            check=False,
            env=ENV,
        )
        assert stats.returncode == 0, stats.stderr.decode()
        assert json.loads(stats.stdout)["rows"] == n - n // 10
        before = set(svc.store.tasks)
        args = run_args(svc.url, out, str(manifest), "--state", str(state), "--reuse", str(store))
        args += ["--rotate-images", "1000", "--write-concurrency", "2", "--linger", "1"]
        args += short_deadline(tmp_path)  # (the resume looks for a create killed on its way)
        killed: list[int | None] = []
        lines_out: list[int] = []
        # First as soon as a line is out (reused lines come first), then once a tagged one is.
        for ready in (_any_line, _a_tagged_line):
            proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
            with anyio.fail_after(30):
                while proc.returncode is None and not ready(out):
                    await anyio.sleep(0.02)
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            killed.append(await proc.wait())
            await proc.aclose()
            lines_out.append(out.read_bytes().count(b"\n"))  # whole lines (a kill may cut one)
        # (Tagged lines come last here, with the run's end: the second attempt may finish and
        # exit 0 before its kill lands, a case the checks below already allow for.)
        assert killed[0] == -signal.SIGKILL and killed[1] in (-signal.SIGKILL, 0), killed
        result = await anyio.run_process(
            [*args, "--summary", str(tmp_path / "s.json")], check=False, env=ENV
        )
        asked = _asked(svc, before)
    assert result.returncode == 0, result.stderr.decode()
    o = assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(n)})
    reused = {r["id"] for r in o.results if r.get("reused")}
    assert reused == {f"p{i}" for i in range(n) if i % 10}
    # The service was asked only for rows not in the store (a row of a killed attempt's
    # write of unknown fate may have been asked twice; never a stored one).
    assert set(asked) == {f"p{i}" for i in range(0, n, 10)}
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["reused"] == n - n // 10 and summary["complete"]
    # `reuse stats` shows the night, not its last attempt (which looked up only the rows the
    # killed ones had not taken in: "reused 0, hit rate 0%" for a night that reused 90%).
    stats = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", "reuse", "stats", str(store), "--json"],
        check=False,
        env=ENV,
    )
    last = json.loads(stats.stdout)["last_run"]
    if summary["opened"] == "complete":
        # The second attempt had finished the night (its state complete) when its kill came
        # (tagged lines come last here, with the run's end): it recorded the night in the
        # store, or was killed just before, and the last command, finding the run complete,
        # had nothing to record: then the store's last run is still the seed's (a known
        # window, said in the closing note of 2026-11-26; seen in CI on a loaded machine).
        night, seed = (n, n - n // 10, 0.9), (n - n // 10, 0, 0.0)
        assert (last["looked_up"], last["reused"], last["hit_rate"]) in (night, seed), last
    else:
        assert (last["looked_up"], last["reused"]) == (n, n - n // 10), last
        assert last["stored"] >= n // 10 and last["hit_rate"] == 0.9
    # The first kill fell mid-run: reused lines out, none of the sent rows' yet.
    assert 0 < lines_out[0] < n


async def test_resume_without_reuse_of_a_run_started_with_it_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "reuse.db"
    manifest = _write(
        tmp_path / "m.csv",
        [(f"p{i}", f"https://img.example/{i}.jpg", "acme", "") for i in range(3000)],
    )
    out, rej, state = tmp_path / "a.jsonl", tmp_path / "a.rej", tmp_path / "a.state"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        with anyio.move_on_after(0.5):
            await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                state=state,
                engine=_engine(store),
            )
        with pytest.raises(StateConflictError, match="--reuse"):
            await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                state=state,
                engine=EngineConfig(poll_min=0.02),
            )
        done = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            state=state,
            engine=_engine(store),
        )
    assert done.complete
    assert_exactly_once(out, rej, {f"p{i}" for i in range(3000)})
