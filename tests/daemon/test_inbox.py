"""The inbox on real files: readiness by marker or settle (injected clock), ignored names,
crash-safe claims at every step, resume from .work, done/ and failed/ without overwriting."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.daemon import inbox as inbox_module
from fashiontag_pipeline.daemon.inbox import Claim, Inbox
from fashiontag_pipeline.daemon.leases import PostgresClaimLedger
from fashiontag_pipeline.daemon.ledger import (
    ClaimLedger,
    ClaimRecord,
    MemoryClaimLedger,
    SQLiteClaimLedger,
)
from fashiontag_pipeline.daemon.names import is_manifest_name, manifest_stem

CSV = b"id,url\n1,http://127.0.0.1/a.jpg\n2,http://127.0.0.1/b.jpg\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def make_ledger(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[[], ClaimLedger]]:
    """A factory of ledgers over one store: each call is the store opened again after a
    restart (the memory one is simply the same object). PostgreSQL: a real server, a fresh
    database for the test."""
    opened: list[SQLiteClaimLedger | PostgresClaimLedger] = []
    memory = MemoryClaimLedger()
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else ""

    def make() -> ClaimLedger:
        ledger: SQLiteClaimLedger | PostgresClaimLedger
        if request.param == "memory":
            return memory
        if request.param == "postgresql":
            ledger = PostgresClaimLedger(url)
        else:
            ledger = SQLiteClaimLedger(tmp_path / "state.sqlite")
        opened.append(ledger)
        return ledger

    yield make
    for ledger in opened:
        ledger.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "inbox"
    path.mkdir()
    return path


def make_inbox(root: Path, ledger: ClaimLedger, clock: FakeClock, settle: float = 10.0) -> Inbox:
    inbox = Inbox(root, ledger=ledger, settle=settle, clock=clock, wall_clock=lambda: 1.7e9)
    inbox.prepare()
    return inbox


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cat.csv", True),
        ("cat.jsonl", True),
        ("cat.ndjson", True),
        ("cat.csv.gz", True),
        ("cat.ndjson.gz", True),
        (".cat.csv", False),
        ("cat.csv.part", False),
        ("cat.csv.tmp", False),
        ("cat.csv.ready", False),
        ("cat.txt", False),
        ("cat.gz", False),
        (".csv", False),
        ("cat.csv.gz.part", False),
        ("CATALOGUE.CSV", True),
        ("dump.Csv.gz", True),
        ("items.JSONL", True),
        ("items.NDJSON.GZ", True),
        ("cat.CSV.PART", False),
        ("cat.Csv.Tmp", False),
        (".CSV", False),
    ],
)
def test_manifest_names(name: str, expected: bool) -> None:
    assert is_manifest_name(name) is expected


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("cat.csv", "cat"),
        ("cat.csv.gz", "cat"),
        ("a.b.jsonl", "a.b"),
        ("x.ndjson.gz", "x"),
        ("CATALOGUE.CSV", "CATALOGUE"),
        ("dump.Csv.GZ", "dump"),
    ],
)
def test_manifest_stem(name: str, stem: str) -> None:
    assert manifest_stem(name) == stem


@pytest.mark.parametrize("name", ["CATALOGUE.CSV", "dump.Csv.gz", "items.JSONL"])
def test_a_manifest_whose_suffix_is_in_capitals_is_claimed(root: Path, name: str) -> None:
    """A Windows or mainframe export (``CATALOGUE.CSV``) was no manifest (the suffix test was
    case-sensitive): it sat in the inbox for ever, nothing logged. The readers tell the format
    from the content, so it is a manifest; its outputs go to ``OUTBOX/STEM`` as any other."""
    data = gzip.compress(CSV) if name.lower().endswith(".gz") else CSV
    (root / name).write_bytes(data)
    inbox = make_inbox(root, MemoryClaimLedger(), FakeClock(), settle=0.0)
    assert inbox.scan() == [root / name]
    claim = inbox.claim(root / name)
    assert claim is not None and Path(claim.path).read_bytes() == data
    done = inbox.finish(claim, "done")
    assert done == root / "done" / name


def test_settle_waits_for_size_and_mtime_to_stay_still(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    clock = FakeClock()
    inbox = make_inbox(root, make_ledger(), clock)
    path = root / "cat.csv"
    path.write_bytes(CSV[:10])
    assert inbox.scan() == []
    clock.now += 6
    with path.open("ab") as fh:  # a slow producer is still writing
        fh.write(CSV[10:20])
    assert inbox.scan() == []
    clock.now += 6  # 12 s after the first sight, 6 s after the last change
    assert inbox.scan() == []
    with path.open("ab") as fh:
        fh.write(CSV[20:])
    os.utime(path, ns=(1, 1))  # same size would not do: mtime changed too
    assert inbox.scan() == []
    clock.now += 9.9
    assert inbox.scan() == []
    clock.now += 0.1
    assert inbox.scan() == [path]


def test_ready_marker_makes_it_ready_at_once_and_is_deleted_on_claim(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    clock = FakeClock()
    inbox = make_inbox(root, make_ledger(), clock)
    (root / "cat.csv").write_bytes(CSV)
    (root / "cat.csv.ready").touch()
    (root / "dog.csv").write_bytes(CSV)  # no marker: waits for settle
    assert inbox.scan() == [root / "cat.csv"]
    claim = inbox.claim(root / "cat.csv")
    assert claim is not None
    assert not (root / "cat.csv.ready").exists()
    assert not (root / "cat.csv").exists()
    assert Path(claim.path) == root / ".work" / "cat.csv"
    assert Path(claim.path).read_bytes() == CSV


def test_ignored_names_and_subfolders_never_become_ready(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    clock = FakeClock()
    inbox = make_inbox(root, make_ledger(), clock, settle=0.0)
    for name in (".hidden.csv", "cat.csv.part", "cat.csv.tmp", "notes.txt", "dump.gz"):
        (root / name).write_bytes(CSV)
    (root / "orphan.csv.ready").touch()  # a marker without its manifest
    (root / "folder.csv").mkdir()
    (root / "folder.csv" / "inner.csv").write_bytes(CSV)
    (root / "folder.csv.ready").touch()
    clock.now += 100
    assert inbox.scan() == []


def test_claim_hashes_the_content_and_records_before_moving(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    data = gzip.compress(CSV * 1000)
    (root / "cat.csv.gz").write_bytes(data)
    [path] = inbox.scan()
    claim = inbox.claim(path)
    assert claim == Claim(
        name="cat.csv.gz",
        path=str(root / ".work" / "cat.csv.gz"),
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        claimed_at=1.7e9,
    )
    [record] = ledger.in_flight()
    assert (record.name, record.sha256, record.status) == ("cat.csv.gz", claim.sha256, "claimed")


def test_a_file_that_changes_while_hashed_is_not_claimed(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    path = root / "cat.csv"
    path.write_bytes(CSV)
    real_hash = inbox_module.hash_file

    def hash_while_producer_appends(p: Path, stop: object = None) -> tuple[str, int]:
        result = real_hash(p)
        with p.open("ab") as fh:
            fh.write(b"3,http://127.0.0.1/c.jpg\n")
        return result

    monkeypatch.setattr(inbox_module, "hash_file", hash_while_producer_appends)
    assert inbox.scan() == [path]
    assert inbox.claim(path) is None
    assert path.exists() and ledger.in_flight() == []
    monkeypatch.setattr(inbox_module, "hash_file", real_hash)
    claim = inbox.claim(path)
    assert claim is not None
    assert claim.sha256 == hashlib.sha256(Path(claim.path).read_bytes()).hexdigest()


def test_a_file_renamed_over_the_name_while_it_is_hashed_is_not_claimed_under_the_other_hash(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of the same size and mtime (``rsync -t``, ``cp -p`` of a fixed-width export)
    renamed over the name while it is hashed: only size and mtime were compared before and
    after the hash, so it was moved and claimed under the first file's hash, and a later drop
    of that first content was a duplicate of it, its rows never tagged. The inode counts too:
    it is not claimed this time (it settles again), then under its own hash."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    path = root / "cat.csv"
    other = CSV.replace(b"a.jpg", b"z.jpg")  # the same size
    path.write_bytes(CSV)
    stamp = path.stat().st_mtime_ns
    real_hash = inbox_module.hash_file

    def hash_then_replace(p: Path, stop: object = None) -> tuple[str, int]:
        got = real_hash(p)
        incoming = root / ".incoming"
        incoming.write_bytes(other)
        os.utime(incoming, ns=(stamp, stamp))
        os.rename(incoming, p)
        return got

    monkeypatch.setattr(inbox_module, "hash_file", hash_then_replace)
    [ready] = inbox.scan()
    assert inbox.claim(ready) is None
    monkeypatch.setattr(inbox_module, "hash_file", real_hash)
    [ready] = inbox.scan()
    claim = inbox.claim(ready)
    assert claim is not None and Path(claim.path).read_bytes() == other
    assert claim.sha256 == hashlib.sha256(other).hexdigest()


@pytest.mark.parametrize("how", ["rename", "rewrite"])
def test_a_file_renamed_over_the_name_before_its_move_is_claimed_under_its_own_hash(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A producer renames another file over NAME (or deletes it and writes it again: the
    inode number may come back) after it was hashed, before the claim moves it: the file
    moved is the one claimed, under its own hash (under the first one's, a later drop of that
    first content would be taken for a duplicate and never tagged)."""
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    path = root / "cat.csv"
    path.write_bytes(CSV)
    other = CSV + b"9,http://127.0.0.1/z.jpg\n"
    real = ledger.record_claim
    replaced: list[bool] = []

    def record_then_replace(record: ClaimRecord) -> None:
        real(record)
        if not replaced:
            replaced.append(True)
            if how == "rename":
                incoming = root / ".incoming"
                incoming.write_bytes(other)
                os.rename(incoming, path)
            else:
                path.unlink()
                path.write_bytes(other)

    monkeypatch.setattr(ledger, "record_claim", record_then_replace)
    assert inbox.scan() == [path]
    claim = inbox.claim(path)
    assert claim is not None and replaced
    assert Path(claim.path).read_bytes() == other
    assert claim.sha256 == hashlib.sha256(other).hexdigest() and claim.size == len(other)
    [record] = ledger.in_flight()
    assert record.sha256 == claim.sha256


def test_a_crash_before_the_moved_files_own_hash_was_recorded_is_mended_at_start_up(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """Killed after another file was moved in under NAME, before its own hash replaced the
    first file's in the ledger: start-up sees the size differ and records the file's own."""
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    other = CSV + b"9,http://127.0.0.1/z.jpg\n"
    ledger.record_claim(
        ClaimRecord(
            name="cat.csv", sha256=hashlib.sha256(CSV).hexdigest(), size=len(CSV), claimed_at=1.6e9
        )
    )
    (root / ".work" / "cat.csv").write_bytes(other)
    [claim] = make_inbox(root, make_ledger(), FakeClock(), settle=0.0).recover()
    assert claim.sha256 == hashlib.sha256(other).hexdigest() and claim.size == len(other)
    assert claim.claimed_at == 1.6e9
    assert inbox.ledger.lookup("cat.csv") is not None


def test_a_name_too_long_for_its_ready_marker_is_claimed(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """A legal name of 250 bytes has no room for ``.ready``: its marker cannot exist, and the
    claim does not fail looking for it."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    path = root / ("c" * 246 + ".csv")
    path.write_bytes(CSV)
    assert inbox.scan() == [path]
    claim = inbox.claim(path)
    assert claim is not None and Path(claim.path).exists()


class UnwritableLedger(MemoryClaimLedger):
    def record_claim(self, record: ClaimRecord) -> None:
        raise OSError(30, "Read-only file system")


def test_an_unwritable_ledger_leaves_the_file_where_it_was(root: Path) -> None:
    inbox = make_inbox(root, UnwritableLedger(), FakeClock(), settle=0.0)
    (root / "cat.csv").write_bytes(CSV)
    (root / "cat.csv.ready").touch()
    with pytest.raises(OSError):
        inbox.claim(root / "cat.csv")
    assert (root / "cat.csv").exists() and (root / "cat.csv.ready").exists()
    assert list((root / ".work").iterdir()) == []


def test_crash_after_recording_before_rename_claims_it_again_once(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    (root / "cat.csv").write_bytes(CSV)
    (root / "cat.csv.ready").touch()

    def crash(*args: object) -> None:
        raise KeyboardInterrupt  # the process dies between recording and renaming

    monkeypatch.setattr(inbox_module.os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        inbox.claim(root / "cat.csv")
    monkeypatch.undo()
    assert (root / "cat.csv").exists()
    assert not (root / "cat.csv.ready").exists()  # no stale marker left for a later file

    ledger = make_ledger()  # restart
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    assert inbox.recover() == []
    assert [r.name for r in ledger.in_flight()] == ["cat.csv"]  # kept: the file is still here
    [path] = inbox.scan()
    assert inbox.claim(path) is not None
    assert [r.name for r in ledger.in_flight()] == ["cat.csv"]  # still one claim


async def test_manifests_in_work_at_start_up_resume_first(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    (root / "old.csv").write_bytes(CSV)
    first = inbox.claim(root / "old.csv")
    assert first is not None
    (root / "new.csv").write_bytes(CSV + b"3,http://127.0.0.1/c.jpg\n")
    (root / "new.csv.ready").touch()
    (root / ".work" / "lost-ledger.jsonl").write_bytes(b'{"id":"1","url":"http://x/1.jpg"}\n')

    # Restart (real wall clock: the unrecorded one is claimed now, after old.csv).
    inbox = Inbox(root, ledger=make_ledger(), settle=0.0, scan_interval=0.01)
    got: list[Claim] = []
    with anyio.fail_after(10):
        async for claim in inbox.claims():
            got.append(claim)
            if len(got) == 3:
                break
    assert [(c.name, c.resumed) for c in got] == [
        ("old.csv", True),
        ("lost-ledger.jsonl", True),
        ("new.csv", False),
    ]
    resumed = next(c for c in got if c.name == "old.csv")
    assert (resumed.sha256, resumed.claimed_at) == (first.sha256, first.claimed_at)
    unrecorded = next(c for c in got if c.name == "lost-ledger.jsonl")
    assert (
        unrecorded.sha256
        == hashlib.sha256((root / ".work" / "lost-ledger.jsonl").read_bytes()).hexdigest()
    )
    assert {r.name for r in inbox.ledger.in_flight()} == {"old.csv", "lost-ledger.jsonl", "new.csv"}


def test_a_claim_whose_file_vanished_is_abandoned(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger()
    ledger.record_claim(ClaimRecord(name="gone.csv", sha256="0" * 64, size=1, claimed_at=1.0))
    inbox = make_inbox(root, ledger, FakeClock())
    assert inbox.recover() == []
    assert ledger.in_flight() == []
    record = ledger.lookup("gone.csv")
    assert record is not None and record.status == "abandoned"


def test_finish_moves_to_done_without_overwriting(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    placed: list[Path] = []
    for content in (CSV, CSV + b"3,http://127.0.0.1/c.jpg\n", CSV):
        (root / "cat.csv").write_bytes(content)
        claim = inbox.claim(root / "cat.csv")
        assert claim is not None
        placed.append(inbox.finish(claim, "done" if len(placed) < 2 else "duplicate"))
    sha = [hashlib.sha256(c).hexdigest()[:12] for c in (CSV, CSV + b"3,http://127.0.0.1/c.jpg\n")]
    assert [p.name for p in placed] == ["cat.csv", f"cat.{sha[1]}.csv", f"cat.{sha[0]}.csv"]
    assert placed[0].read_bytes() == CSV and placed[2].read_bytes() == CSV
    done = ledger.find_completed(hashlib.sha256(CSV).hexdigest())
    assert done is not None and done.settled_as == "done/cat.csv"
    # A fourth of the same name and content: counted suffix.
    (root / "cat.csv").write_bytes(CSV)
    claim = inbox.claim(root / "cat.csv")
    assert claim is not None
    assert inbox.finish(claim, "duplicate").name == f"cat.{sha[0]}.2.csv"


def test_fail_moves_to_failed_beside_its_reason(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    (root / "failed" / "bad.csv.error.json").write_text('{"reason": "an earlier one"}')
    (root / "bad.csv").write_bytes(b"\x00\x01 not a manifest")
    claim = inbox.claim(root / "bad.csv")
    assert claim is not None
    target = inbox.fail(claim, "no url column")
    assert target.name == f"bad.{claim.sha256[:12]}.csv"
    assert target.read_bytes() == b"\x00\x01 not a manifest"
    error = json.loads((root / "failed" / f"{target.name}.error.json").read_text())
    assert error == {"reason": "no url column", "sha256": claim.sha256}
    # The earlier error file is untouched.
    assert json.loads((root / "failed" / "bad.csv.error.json").read_text()) == {
        "reason": "an earlier one"
    }
    record = ledger.lookup("bad.csv")
    assert record is not None and record.status == "failed"
    assert ledger.find_completed(claim.sha256) is None


def test_a_failed_manifest_with_a_name_near_the_limit_gets_names_that_fit(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """A 250-byte name has no room for ``.error.json``: the failed manifest is moved under a
    name cut to fit with its reason beside it, never an error that stops the daemon."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    name = "b" * 246 + ".csv"
    (root / name).write_bytes(b"\x00\x01 not a manifest")
    claim = inbox.claim(root / name)
    assert claim is not None
    target = inbox.fail(claim, "no url column")
    assert target.exists() and len(f"{target.name}.error.json".encode()) <= 255
    assert target.name.endswith(f".{claim.sha256[:12]}.csv")
    error = json.loads((root / "failed" / f"{target.name}.error.json").read_text())
    assert error["reason"] == "no url column"


def test_a_crash_after_the_error_file_reuses_its_name(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """fail() writes NAME.error.json first; a crash before the manifest moves leaves it alone.
    The next attempt (after a restart) reuses that name: no error file without its manifest."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    (root / "bad.csv").write_bytes(b"\x00\x01 not a manifest")
    claim = inbox.claim(root / "bad.csv")
    assert claim is not None
    with pytest.MonkeyPatch.context() as mp:

        def crash(*args: object) -> None:
            raise OSError("power cut")

        mp.setattr(inbox.ledger, "record_settled", crash)
        with pytest.raises(OSError):
            inbox.fail(claim, "no url column")
    assert (root / "failed" / "bad.csv.error.json").exists()
    target = inbox.fail(claim, "no url column")
    assert target == root / "failed" / "bad.csv"
    assert sorted(p.name for p in (root / "failed").iterdir()) == ["bad.csv", "bad.csv.error.json"]


def test_crash_between_settling_and_moving_is_finished_at_start_up(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    (root / "cat.csv").write_bytes(CSV)
    claim = inbox.claim(root / "cat.csv")
    assert claim is not None

    def crash(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(inbox_module.os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        inbox.finish(claim, "done")
    monkeypatch.undo()
    assert Path(claim.path).exists()

    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)  # restart
    assert inbox.recover() == []  # settled: not resumed again
    assert (root / "done" / "cat.csv").read_bytes() == CSV
    assert not Path(claim.path).exists()


def test_a_name_in_flight_blocks_a_new_file_of_that_name(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    (root / "cat.csv").write_bytes(CSV)
    first = inbox.claim(root / "cat.csv")
    assert first is not None
    (root / "cat.csv").write_bytes(b"id,url\n9,http://127.0.0.1/z.jpg\n")
    (root / "cat.csv.ready").touch()
    assert inbox.scan() == []
    assert inbox.claim(root / "cat.csv") is None
    assert Path(first.path).read_bytes() == CSV  # the manifest in flight is intact
    inbox.finish(first, "done")
    assert inbox.scan() == [root / "cat.csv"]


def test_sqlite_ledger_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    ledger = SQLiteClaimLedger(path)
    ledger.record_claim(ClaimRecord(name="a.csv", sha256="a" * 64, size=3, claimed_at=1.5))
    ledger.record_claim(ClaimRecord(name="b.csv", sha256="b" * 64, size=4, claimed_at=2.5))
    ledger.record_settled("a.csv", "done", "done/a.csv")
    ledger.close()
    ledger = SQLiteClaimLedger(path)
    try:
        assert [r.name for r in ledger.in_flight()] == ["b.csv"]
        found = ledger.find_completed("a" * 64)
        assert found is not None and (found.settled_as, found.claimed_at) == ("done/a.csv", 1.5)
        with pytest.raises(KeyError):
            ledger.record_settled("a.csv", "done", "done/a.csv")  # not in flight any more
    finally:
        ledger.close()


async def test_a_file_rewritten_while_the_consumer_waits_settles_again(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """Two files are ready; the consumer takes the first and, much later, asks for the next:
    the second was rewritten meanwhile, so it is not claimed until it has settled again."""
    clock = FakeClock()
    inbox = Inbox(root, ledger=make_ledger(), settle=10.0, clock=clock, scan_interval=0.01)
    inbox.prepare()
    (root / "a.csv").write_bytes(CSV)
    (root / "b.csv").write_bytes(CSV)
    inbox.scan()
    clock.now += 11
    claims = inbox.claims()
    with anyio.fail_after(10):
        first = await claims.__anext__()
    assert first.name == "a.csv"
    # The producer rewrites b.csv (a new dump, being written) before the next claim is asked.
    (root / "b.csv").write_bytes(CSV[:12])
    got: list[Claim] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                got.append(await claims.__anext__())

            tg.start_soon(take)
            await anyio.sleep(0.3)  # scans happen every 10 ms meanwhile
            assert got == [], "claimed a file that had not settled again"
            clock.now += 11
    await claims.aclose()
    assert got[0].name == "b.csv" and got[0].size == 12


def test_a_file_that_cannot_be_claimed_goes_to_failed_and_the_others_on(
    root: Path, make_ledger: Callable[[], ClaimLedger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest another account dropped unreadable to the daemon, and one whose name is not
    UTF-8 (the ledger and the outputs name manifests in UTF-8): each moves to failed/ beside
    its reason, never an exception out of the scan (which stopped the daemon, and stopped it
    again at every start), and the manifest dropped after them is claimed."""
    ledger = make_ledger()
    inbox = make_inbox(root, ledger, FakeClock(), settle=0.0)
    bad_name = os.fsdecode(b"caf\xe9.csv")
    (root / bad_name).write_bytes(CSV)
    (root / "locked.csv").write_bytes(CSV)
    (root / "ok.csv").write_bytes(CSV)
    real_hash = inbox_module.hash_file

    def hash_file(path: Path, stop: object = None) -> tuple[str, int]:
        if path.name == "locked.csv":
            raise PermissionError(13, "Permission denied", str(path))
        return real_hash(path)

    monkeypatch.setattr(inbox_module, "hash_file", hash_file)
    claims = [inbox.claim(path) for path in inbox.scan()]
    assert [c.name for c in claims if c is not None] == ["ok.csv"]
    failed = root / "failed"
    assert (failed / "caf\\xe9.csv").exists() and (failed / "locked.csv").exists()
    reasons = {p.name: json.loads(p.read_text())["reason"] for p in failed.glob("*.error.json")}
    assert "Permission denied" in reasons["locked.csv.error.json"]
    assert "not UTF-8" in reasons["caf\\xe9.csv.error.json"]
    assert inbox.scan() == []


def test_a_ready_marker_older_than_its_file_does_not_make_it_ready(
    root: Path, make_ledger: Callable[[], ClaimLedger]
) -> None:
    """A ``NAME.ready`` left from an earlier drop (or written before its file): a file of that
    name written in place later is not complete because of it; it waits to settle."""
    clock = FakeClock()
    inbox = make_inbox(root, make_ledger(), clock)
    marker = root / "cat.csv.ready"
    marker.touch()
    os.utime(marker, ns=(1_000_000_000, 1_000_000_000))  # long before the file
    (root / "cat.csv").write_bytes(CSV)
    assert inbox.scan() == []
    clock.now += 11.0
    assert inbox.scan() == [root / "cat.csv"]


def test_a_symlink_or_a_fifo_named_as_a_manifest_goes_to_failed_with_its_reason(
    root: Path, make_ledger: Callable[[], ClaimLedger], tmp_path: Path
) -> None:
    """Not a file the daemon can claim (a rename would move the link, not the manifest): it
    was ignored in silence for ever, and the producer never learnt its manifest was not
    tagged. It goes to failed/ beside its reason, with its marker."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    target = tmp_path / "elsewhere.csv"
    target.write_bytes(CSV)
    (root / "link.csv").symlink_to(target)
    (root / "link.csv.ready").touch()
    os.mkfifo(root / "pipe.csv")
    assert inbox.scan() == []
    failed = root / "failed"
    assert (failed / "link.csv").is_symlink() and (failed / "pipe.csv").exists()
    reason = json.loads((failed / "link.csv.error.json").read_text())["reason"]
    assert "not a regular file" in reason
    assert not (root / "link.csv.ready").exists()
    assert target.read_bytes() == CSV


def test_a_file_that_cannot_be_moved_to_failed_is_left_alone_said_once(
    root: Path,
    make_ledger: Callable[[], ClaimLedger],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """failed/ on another volume (EXDEV), say: the symlink stays where it is, said once,
    and no error file is left behind on each scan."""
    inbox = make_inbox(root, make_ledger(), FakeClock(), settle=0.0)
    target = tmp_path / "elsewhere.csv"
    target.write_bytes(CSV)
    (root / "link.csv").symlink_to(target)
    real_rename = os.rename

    def rename(src: object, dst: object) -> None:
        if str(src).endswith("link.csv"):
            raise OSError(18, "Invalid cross-device link")
        real_rename(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rename", rename)
    for _ in range(3):
        assert inbox.scan() == []
    assert list((root / "failed").iterdir()) == []
    assert sum("cannot be moved" in r.getMessage() for r in caplog.records) == 1
    assert (root / "link.csv").is_symlink()


def test_a_file_named_as_no_manifest_is_said_once(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A catalogue dropped as ``catalogue.tsv`` or ``.txt`` (Excel's text exports), the
    workbook itself (``.xlsx``) or a ``dump.csv.zip`` sat in the inbox for ever, nothing
    logged: never tagged, and nobody told. Each is said once (a warning naming it and the
    names a manifest has) and left where it is; hidden, temporary and marker files and
    folders are not."""
    foreign = ["catalogue.tsv", "catalogue.txt", "catalogue.xlsx", "dump.csv.zip"]
    for name in [*foreign, ".hidden.csv", "x.csv.part", "x.csv.tmp", "x.csv.ready"]:
        (root / name).write_bytes(CSV)
    (root / "sub").mkdir()
    inbox = make_inbox(root, MemoryClaimLedger(), FakeClock(), settle=0.0)
    caplog.set_level("WARNING", logger="fashiontag_pipeline.daemon")
    assert inbox.scan() == []
    assert inbox.scan() == []
    said = [r.getMessage() for r in caplog.records if "is not a manifest" in r.getMessage()]
    assert sorted(m.split()[1] for m in said) == sorted(foreign), said
    assert all(".csv" in m and ".ndjson" in m for m in said)
    assert all((root / name).read_bytes() == CSV for name in foreign)


def test_a_folder_named_as_a_manifest_is_said_once(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark and Hadoop write ``df.write.csv("inbox/export.csv")`` as a folder of part files
    named like a manifest: it sat in the inbox for ever, nothing logged. It is said once (a
    warning naming it) and left where it is; other folders are not."""
    (root / "export.csv").mkdir()
    (root / "export.csv" / "part-00000.csv").write_bytes(CSV)
    (root / "archive").mkdir()
    inbox = make_inbox(root, MemoryClaimLedger(), FakeClock(), settle=0.0)
    caplog.set_level("WARNING", logger="fashiontag_pipeline.daemon")
    assert inbox.scan() == []
    assert inbox.scan() == []
    said = [r.getMessage() for r in caplog.records if "export.csv" in r.getMessage()]
    assert len(said) == 1 and "folder" in said[0], said
    assert not [r for r in caplog.records if "archive" in r.getMessage()]
    assert (root / "export.csv" / "part-00000.csv").read_bytes() == CSV
