"""A state file the process may not write (chmod 444 for a user other than root, another
user's file, a read-only mount): the run stopped on ``OperationalError: attempt to write a
readonly database``, naming no file. Tests run as root, which writes a file whatever its
mode: the state is opened read-only (``mode=ro``), as SQLite opens a file it may not write.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.engine.run import default_state_path
from fashiontag_pipeline.engine.state import sqlite as state_sqlite
from fashiontag_pipeline.engine.state.sqlite import StateDB

from .helpers import TASKS_OF_1000, client_config, write_csv


class _ReadOnlySqlite:
    """``sqlite3`` whose ``connect`` opens the file read-only."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sqlite3, name)

    @staticmethod
    def connect(path: Any, **kwargs: Any) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, **kwargs)


async def test_a_state_file_that_cannot_be_written_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 10)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state = default_state_path(out)
    StateDB(state).close()  # made by a run of another user, say
    monkeypatch.setattr(state_sqlite, "sqlite3", _ReadOnlySqlite())
    with pytest.raises(sqlite3.Error) as caught:
        await run_pipeline(
            [manifest],
            client=client_config("http://127.0.0.1:9"),
            out=out,
            rejects=rej,
            engine=TASKS_OF_1000,
        )
    message = str(caught.value)
    assert "readonly" in message, message
    assert str(state) in message, message
