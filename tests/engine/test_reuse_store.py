"""The result store of --reuse on its own: fingerprints, lookups, age, damage, stats, prune."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fashiontag_pipeline import ResultStoreError
from fashiontag_pipeline._models import BulkContext, Detection, Image, ImageType, TaggingRequest
from fashiontag_pipeline.engine.config import EngineConfig
from fashiontag_pipeline.engine.reuse import (
    Fingerprinter,
    ResultStore,
    format_duration,
    parse_duration,
)
from fashiontag_pipeline.engine.reuse.store import LOOKUP_BATCH

from .helpers import ENV

DAY = 86_400.0


def request(
    ident: str, url: str = "https://img.example/1.jpg", **context: object
) -> TaggingRequest:
    return TaggingRequest(Image(ImageType.URL, url), BulkContext(id=ident, **context))  # type: ignore[arg-type]


def test_fingerprint_is_the_question_not_the_id() -> None:
    fp = Fingerprinter(language="en").of
    assert fp(request("a")) == fp(request("renamed"))  # a renamed product is reused
    assert fp(request("a")) != fp(request("a", url="https://img.example/2.jpg"))
    assert fp(request("a", brand="acme")) != fp(request("a", brand="other"))
    assert fp(request("a", age=["20s"])) != fp(request("a"))
    assert fp(request("a", season="fw")) != fp(request("a", keywords="fw"))  # fields stay apart
    # Detection as a set, after defaults: none given means the clothing default.
    top_shoes = [Detection.TOP, Detection.SHOES]
    assert fp(request("a", detection=top_shoes)) == fp(request("a", detection=top_shoes[::-1]))
    assert fp(request("a", detection=top_shoes)) != fp(request("a"))
    clothing = [Detection.TOP, Detection.BOTTOM, Detection.WHOLEBODY, Detection.SWIMWEAR]
    assert fp(request("a")) == fp(request("a", detection=clothing))
    # The run's default detection applies to rows without their own.
    shoes = Fingerprinter(language="en", default_detection=[Detection.SHOES]).of
    assert shoes(request("a")) == fp(request("a", detection=[Detection.SHOES]))
    assert shoes(request("a")) != fp(request("a"))
    # The language is part of the question.
    assert Fingerprinter(language="ko").of(request("a")) != fp(request("a"))
    assert len(fp(request("a"))) == 16


def test_lookup_put_and_age(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with ResultStore.open(path) as store:
        assert store.created
        fps = [i.to_bytes(16, "little") for i in range(LOOKUP_BATCH * 2 + 7)]
        n = store.put([(fp, "task-1", b'{"status":"success"}') for fp in fps[:-1]], stored_at=1000)
        assert n == len(fps) - 1
        # Batched lookups across several IN queries; the missing one is absent.
        found = store.lookup(fps, newer_than=0)
        assert set(found) == set(fps[:-1])
        assert found[fps[0]].task_id == "task-1"
        assert found[fps[0]].result == b'{"status":"success"}'
        # Too old for the max age: not reused.
        assert store.lookup(fps[:3], newer_than=1000.5) == {}
        # A newer result replaces the older one.
        store.put([(fps[0], "task-2", b'{"status":"success","v":2}')], stored_at=2000)
        assert store.lookup([fps[0]], newer_than=1500)[fps[0]].task_id == "task-2"
    with ResultStore.open(path) as again:
        assert not again.created
        stats = again.stats()
        assert stats.rows == len(fps) - 1
        assert (stats.oldest, stats.newest) == (1000, 2000)
        assert stats.last_run is None
        assert again.prune(1500, now=lambda: 3000) == len(fps) - 2
        assert again.stats().rows == 1


def test_fingerprints_sharing_a_prefix_never_answer_for_each_other(tmp_path: Path) -> None:
    a, b = b"\x01" * 8 + b"A" * 8, b"\x01" * 8 + b"B" * 8
    with ResultStore.open(tmp_path / "store.db") as store:
        store.put([(a, "task-a", b'{"status":"success"}')], stored_at=1.0)
        assert store.lookup([b], newer_than=0) == {}
        store.put([(b, "task-b", b'{"status":"success"}')], stored_at=2.0)
        found = store.lookup([a, b], newer_than=0)
        assert (found[a].task_id, found[b].task_id) == ("task-a", "task-b")


def test_reuse_options_from_a_config_file_and_flags(tmp_path: Path) -> None:
    from fashiontag_pipeline.cli.commands import _build_parser
    from fashiontag_pipeline.cli.engine_flags import engine_config_from_args

    config = tmp_path / "c.toml"
    config.write_text('[engine]\nreuse = "/var/lib/ft/results.db"\nreuse_max_age = "12h"\n')
    parser = _build_parser("run")
    args = parser.parse_args(["run", "m.csv", "--config", str(config)])
    engine = engine_config_from_args(args)
    assert engine.reuse == "/var/lib/ft/results.db"
    assert engine.reuse_max_age_seconds == 12 * 3600
    args = parser.parse_args(
        ["run", "m.csv", "--config", str(config), "--reuse", "x.db", "--reuse-max-age", "2d"]
    )
    engine = engine_config_from_args(args)
    assert (engine.reuse, engine.reuse_max_age_seconds) == ("x.db", 2 * DAY)
    assert EngineConfig().reuse is None and EngineConfig().reuse_max_age_seconds == 30 * DAY


@pytest.mark.parametrize(
    "content",
    [b"this is not a database at all" * 200, b"SQLite format 3\x00" + b"\xff" * 4000],
)
def test_damaged_store_is_a_clear_error_and_left_alone(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(content)
    with pytest.raises(ResultStoreError, match=str(path)):
        ResultStore.open(path)
    assert path.read_bytes() == content


def test_other_sqlite_file_and_newer_schema_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(ResultStoreError, match="not a fashiontag result store"):
        ResultStore.open(other)
    newer = tmp_path / "newer.db"
    ResultStore.open(newer).close()
    db = sqlite3.connect(newer)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(ResultStoreError, match="schema version 99"):
        ResultStore.open(newer)


def test_durations() -> None:
    assert parse_duration("30d") == 30 * DAY
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("1.5h") == 5400
    assert parse_duration("90") == 90
    assert parse_duration(7.0) == 7
    assert format_duration(30 * DAY) == "30d"
    for bad in ("", "d", "-1d", "3y", "12 hours"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError, match="reuse_max_age"):
        EngineConfig(reuse_max_age="soon")


def test_duration_unit_lookalike_is_refused_not_a_traceback(tmp_path: Path) -> None:
    # "s" matched the long s (U+017F) case-insensitively, whose lower() is no unit: KeyError.
    assert parse_duration("2D") == 2 * DAY and parse_duration("45S") == 45
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("5\u017f")
    done = _cli("prune", str(tmp_path / "store.db"), "--older-than", "5\u017f")
    assert done.returncode == 2, done.stderr
    assert "invalid duration" in done.stderr and "Traceback" not in done.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "reuse", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_stats_and_prune(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    missing = _cli("stats", str(path))
    assert missing.returncode == 1 and str(path) in missing.stderr
    assert not path.exists()  # stats never creates a store
    with ResultStore.open(path) as store:
        store.put([(b"a" * 16, "t", b"{}"), (b"b" * 16, "t", b"{}")], stored_at=0.0)
        store.put([(b"c" * 16, "t", b"{}")], stored_at=4e9)  # far in the future: never pruned
        store.record_run(started_at=10, finished_at=20, looked_up=4, reused=3, stored=1)
    stats = _cli("stats", str(path), "--json")
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert data["rows"] == 3 and data["size_bytes"] > 0
    assert data["last_run"]["hit_rate"] == 0.75
    text = _cli("stats", str(path))
    assert "hit rate 75.0%" in text.stdout and "rows 3" in text.stdout
    pruned = _cli("prune", str(path), "--older-than", "30d")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 2" in pruned.stdout
    assert json.loads(_cli("stats", str(path), "--json").stdout)["rows"] == 1
    bad = _cli("prune", str(path), "--older-than", "soon")
    assert bad.returncode == 2 and "soon" in bad.stderr
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"x" * 5000)
    broken = _cli("stats", str(garbage))
    assert broken.returncode == 1 and str(garbage) in broken.stderr


def test_cli_stats_of_an_empty_file_says_so(tmp_path: Path) -> None:
    """A 0-byte file (a `touch`, a copy that failed) is there: "does not exist" sent the
    operator looking for a file in front of them."""
    empty = tmp_path / "store.db"
    empty.write_bytes(b"")
    for args in (("stats", str(empty)), ("prune", str(empty), "--older-than", "30d")):
        done = _cli(*args)
        assert done.returncode == 1, done
        assert str(empty) in done.stderr and "is an empty file" in done.stderr, done.stderr
        assert "does not exist" not in done.stderr
    assert empty.read_bytes() == b""  # left as it was


def test_prune_by_a_bare_number_is_refused_not_read_as_seconds(tmp_path: Path) -> None:
    """``reuse prune STORE --older-than 30`` (meaning 30 days, as a retention setting is
    usually written): the bare number was read as 30 seconds and every result stored before
    half a minute ago was deleted, the store emptied; the next night billed every row
    again. A prune deletes: it takes a duration with its unit, and a bare number is refused
    naming both readings, the store left as it was."""
    path = tmp_path / "store.db"
    with ResultStore.open(path) as store:
        store.put([(b"a" * 16, "t", b"{}"), (b"b" * 16, "t", b"{}")], stored_at=0.0)
    done = _cli("prune", str(path), "--older-than", "30")
    assert done.returncode == 2, done
    assert "30d for 30 days" in done.stderr and "30s for 30 seconds" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(_cli("stats", str(path), "--json").stdout)["rows"] == 2


@pytest.mark.parametrize("action", [["stats"], ["prune", "--older-than", "30d"]])
def test_reuse_of_a_folder_says_it_is_one(tmp_path: Path, action: list[str]) -> None:
    """``fashiontag reuse stats /data/stores/`` (the folder, not the store in it) was exit 1,
    ``unable to open database file (it is left untouched; move it away to start an empty
    store, and every row will be tagged again)``: advice to move the folder away; a FIFO or
    ``/dev/zero`` was called ``an empty file``. Each is now exit 2 saying what it is, as
    ``run --reuse`` says it."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for store, said in ((tmp_path, "is a folder"), (fifo, "not a regular file")):
        argv = ["reuse", action[0], str(store), *action[1:]]
        done = subprocess.run(
            [sys.executable, "-m", "fashiontag_pipeline", *argv],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "move it away" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_cli_stats_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    """``reuse stats`` (a monitoring check, hourly) wrote the store it looks at: a first frame
    in its ``-wal`` at each open (meant for the runs and daemons that hold the store), copied
    into the file at the close, so its header changed and its time was now: a backup that
    copies what changed (``rsync``, an incremental snapshot) copied the whole store again after
    every look. A look writes nothing."""
    path = tmp_path / "store.db"
    with ResultStore.open(path) as store:
        store.put([(b"a" * 16, "t", b"{}")], stored_at=0.0)
    os.utime(path, (1e9, 1e9))
    before = path.read_bytes()
    for args in (("stats", str(path)), ("stats", str(path), "--json")):
        done = _cli(*args)
        assert done.returncode == 0, done.stderr
    # Before: bytes 28 and 96 (the change counter, its version-valid-for) moved, time now.
    assert (path.stat().st_mtime, path.read_bytes() == before) == (1e9, True)


def test_a_store_put_over_the_open_one_is_opened_as_it_was_put(tmp_path: Path) -> None:
    """A store file put over the one a process holds (a backup restored by ``mv`` or
    ``rsync``; the daemon stops on it): the process's ``-wal`` and ``-shm`` were left beside
    it at the close (SQLite keeps the ``-wal`` of a database moved under it), and the next
    open read the file put there through them: the store it opened held the results the
    process had stored, not the backup's."""
    path = tmp_path / "store.db"
    fps = [i.to_bytes(16, "little") for i in range(200)]
    with ResultStore.open(path) as store:
        store.put([(fp, "task-1", b'{"status":"success"}') for fp in fps[:10]], stored_at=1000)
        with sqlite3.connect(tmp_path / "backup.db") as backup:
            store._writer.backup(backup)  # (the operator's backup: the store as it was)
        backup.close()
        store.put([(fp, "task-2", b'{"status":"success"}') for fp in fps[10:]], stored_at=2000)
        os.replace(tmp_path / "backup.db", path)  # (the backup restored over it)
    with ResultStore.open(path) as again:
        rows = again.stats().rows
    # Before: 200 (the process's -wal read over the backup put there).
    assert rows == 10
