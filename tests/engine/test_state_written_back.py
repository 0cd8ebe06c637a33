"""A SQLite state file removed under the process that holds it (``rm state.db``) is written
back at its path from the open connection when the process stops on it: that copy is put
there while the state's lock is still held. Put there after the lock was released, a second
run or daemon started meanwhile on the same state took the lock, found no file, and began an
empty state at the path (the manifests done forgotten: tagged, and billed, again), the copy
left aside as ``.state.PID.back``."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest

from fashiontag_pipeline._exceptions import StateError, StateInUseError
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.engine.state.sqlite import state_free


def test_a_removed_state_is_put_back_before_its_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "a.db"
    db = StateDB(state)
    with db.transaction():
        db.set_meta("kept", "yes")
    state.unlink()  # (a cleanup by name)
    with pytest.raises(StateError, match="removed"):
        db.keep_lock()
    free_at_put_back: list[bool] = []
    put_back = StateDB._put_back

    def watched(self: StateDB, copy_at: Path) -> None:
        try:
            state_free(state)  # (what a second run's open finds first: the lock)
        except StateInUseError:
            free_at_put_back.append(False)
        else:
            free_at_put_back.append(True)
        put_back(self, copy_at)

    monkeypatch.setattr(StateDB, "_put_back", watched)
    db.close()
    # Before: the lock was free while nothing was at the path (a second run began there).
    assert free_at_put_back == [False]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".back")] == []
    again = StateDB(state)
    try:
        assert again.meta("kept") == "yes"
    finally:
        again.close()


def test_a_state_put_over_the_open_one_is_opened_as_it_was_put(tmp_path: Path) -> None:
    """A state file put over the one a process holds (a backup restored by ``mv`` or
    ``rsync``, a new state moved in on purpose): the process stops on it and leaves it. Its
    own ``-wal`` and ``-shm`` were left beside that file (SQLite keeps the ``-wal`` of a
    database moved under it), and the next open read the restored file through them: the
    state opened was the one the process had left, not the one put there."""
    state = tmp_path / "a.db"
    db = StateDB(state)
    with db.transaction():
        db.set_meta("which", "the backup's")
    with contextlib.closing(sqlite3.connect(tmp_path / "backup.db")) as backup:
        db.db.backup(backup)  # (the operator's backup: the state as it was then)
    for n in range(50):
        with db.transaction():
            db.set_meta("which", f"the run's, commit {n}")
            db.set_meta(f"k{n}", "x" * 3000)
    os.replace(tmp_path / "backup.db", state)  # (the backup restored over it)
    with pytest.raises(StateError, match="removed"):
        db.keep_lock()
    db.close()
    again = StateDB(state)
    try:
        which = again.meta("which")
    finally:
        again.close()
    # Before: "the run's, commit 49" (the run's -wal read over the file put there).
    assert which == "the backup's"
