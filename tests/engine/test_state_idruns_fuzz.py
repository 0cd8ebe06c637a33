"""A seeded model check of the SQLite state's run-wide dedupe with runs (:mod:`.idruns`):
batches in order after every id held (runs), with repeats of ids held and adjacent equal ids,
batches across runs and shuffled ones, ids of several jobs (``9/`` sorts after ``10/``),
non-ASCII ids whose UTF-8 bytes and code points must sort alike, the empty id, rolled-back
transactions, a long id's mark, a completed run's reclaim, a complete job's forget, and the
state closed or dropped as a kill -9 leaves it then opened again. After each step every
answer (``dedupe``'s first rows' positions, ``first_positions``, ``ids_starting``,
``ids_taken``) must be a plain dict's, and a file holding runs must carry their version.

It found nothing on the build that landed runs (2026-11-28); mishandling a run's low bound in
:func:`.idruns.run_positions` (``<=`` for ``<``) fails it at its first seeds."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import pytest

from fashiontag_pipeline.engine.state import STATE_FILE_VERSION, StateDB

#: Characters of 1 to 4 UTF-8 bytes around their boundaries, the job separator and the empty
#: string (U+10FFFF left out: the tree's prefix look-up stops before it, a limit of its own).
_CHARS = ["a", "z", "/", "0", "1", "9", "\x01", "\x7f", "é", "\u07ff", "\u0800", "\uffff"]
_CHARS += ["\U00010000", "\U0010fffe", " ", ""]
_JOBS = [1, 9, 10, 100]


def _ident(rng: random.Random, jobs: bool) -> str:
    key = "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 4)))
    return f"{rng.choice(_JOBS)}/{key}" if jobs else key


def _batch(rng: random.Random, held: dict[str, int], jobs: bool) -> list[str]:
    mode = rng.random()
    if mode < 0.5:
        return sorted(_ident(rng, jobs) for _ in range(rng.randint(1, 12)))
    if mode < 0.8:  # after every id held, in order: a run, with repeats in it
        top = max(held, default="")
        ids = sorted(top + _ident(rng, jobs) for _ in range(rng.randint(1, 40)))
        for _ in range(rng.randint(0, 4)):
            repeat = rng.choice(list(held)) if held and rng.random() < 0.6 else ids[0]
            ids.insert(rng.randrange(len(ids) + 1), repeat)
        return ids
    return [_ident(rng, jobs) for _ in range(rng.randint(1, 12))]


def _dropped(db: StateDB) -> None:
    """The state as a kill -9 leaves it: nothing flushed, the lock released by the exit."""
    db.db.close()
    os.close(db._lock)
    db._lock = -1


def _check_file(db: StateDB) -> None:
    (runs,) = db.db.execute("SELECT count(*) FROM id_runs").fetchone()
    (version,) = db.db.execute("PRAGMA user_version").fetchone()
    assert not runs or version == STATE_FILE_VERSION, (runs, version)


@pytest.mark.parametrize("seed", range(12))
def test_the_dedupe_with_runs_answers_as_a_dict_would(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "state"
    jobs = seed % 2 == 1
    monkeypatch.setattr(StateDB, "flush_ids", rng.choice([3, 10, 1000]))
    db = StateDB(path)
    held: dict[str, int] = {}
    pos = 1
    try:
        for _ in range(250):
            op = rng.random()
            if op < 0.6:
                ids = _batch(rng, held, jobs)
                keyed = [(key, pos + n) for n, key in enumerate(ids)]
                pos += len(ids)
                after = dict(held)
                expected = [after.setdefault(key, at) for key, at in keyed]
                db.begin()
                try:
                    if rng.random() < 0.15:
                        db.db.execute(*db.long_ids_mark())
                    got = db.dedupe(keyed)
                finally:
                    if rng.random() < 0.1:
                        db.rollback()
                    else:
                        db.commit()
                        held = after
                assert (got or [at for _, at in keyed]) == expected, keyed
            elif op < 0.7:
                asked = [_ident(rng, jobs) for _ in range(5)] + rng.sample(
                    list(held), min(3, len(held))
                )
                assert db.first_positions(asked) == {k: held[k] for k in asked if k in held}
            elif op < 0.78:
                prefix, limit = _ident(rng, jobs)[: rng.randint(0, 3)], rng.randint(1, 5)
                wanted = sorted(k for k in held if k.startswith(prefix))[:limit]
                assert db.ids_starting(prefix, limit) == wanted, prefix
            elif op < 0.82 and jobs:
                job = rng.choice(_JOBS)
                with db.transaction():
                    db._forget_ids(job)
                held = {k: v for k, v in held.items() if not k.startswith(f"{job}/")}
            elif op < 0.84:
                with db.transaction():
                    db.db.execute(*db.long_ids_mark())
            elif op < 0.85:
                db.mark_complete("2026-11-28T00:00:00Z")  # (no job open: every id reclaimed)
                held = {}
            elif op < 0.92:
                if rng.random() < 0.5:
                    _dropped(db)
                else:
                    db.close()
                with sqlite3.connect(path) as raw:
                    (runs,) = raw.execute("SELECT count(*) FROM id_runs").fetchone()
                    (version,) = raw.execute("PRAGMA user_version").fetchone()
                assert not runs or version == STATE_FILE_VERSION, (runs, version)
                db = StateDB(path)
            assert db.ids_taken() == len(held)
            _check_file(db)
    finally:
        db.close()


def test_a_batch_in_no_order_ending_at_a_runs_low_or_starting_at_its_high(tmp_path: Path) -> None:
    """Runs met only at an end (the batch's highest id is a run's lowest, its lowest a run's
    highest): each end found, the ids between taken in once."""
    db = StateDB(tmp_path / "state")
    try:
        for batch, start in ((["b", "c"], 1), (["h", "k"], 3), (["p", "é"], 5)):
            with db.transaction():
                assert db.dedupe([(key, start + n) for n, key in enumerate(batch)]) is None
        assert db._runs == 3
        with db.transaction():  # (between runs: only a run's low in its range)
            assert db.dedupe([("e", 8), ("d", 9), ("h", 10)]) == [8, 9, 3]
        with db.transaction():
            assert db.dedupe([("d", 11), ("a", 12), ("k", 13)]) == [9, 12, 4]
        with db.transaction():
            assert db.dedupe([("é", 20), ("n", 21), ("k", 22)]) == [6, 21, 4]
        assert db.first_positions(["a", "b", "d", "h", "k", "n", "p", "é"]) == {
            "a": 12,
            "b": 1,
            "d": 9,
            "h": 3,
            "k": 4,
            "n": 21,
            "p": 5,
            "é": 6,
        }
    finally:
        db.close()
