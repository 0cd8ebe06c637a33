"""Where the seeded kill -9 fuzz (:mod:`.test_session_fault_fuzz`) keeps a run's state, and
what it reads of it to choose its kill points: a SQLite file beside the output (the run's
default), or a state in a PostgreSQL schema of the tests' server (``--state URL#name``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from .helpers import job_marks, taken_in

__all__ = ["StateProbe", "deleter_of"]

_TAKEN = (
    "SELECT (SELECT coalesce(sum(accepted), 0) FROM {s}.jobs), count(*), "
    "count(*) FILTER (WHERE task_id IS NULL AND written_at IS DISTINCT FROM 0) FROM {s}.chunks"
)
_MARKS = "SELECT validated, results_ckpt, rejects_ckpt FROM {s}.jobs"


@dataclass
class StateProbe:
    """A run's state: ``args`` name it to ``fashiontag run``; :meth:`taken` and :meth:`marks`
    read it as :func:`.helpers.taken_in` and :func:`.helpers.job_marks` do (0s, or -1, while
    it cannot be read), :meth:`exists` says whether a run made it."""

    where: Path | str
    _conn: Any = field(default=None, repr=False)
    _schema: str = ""

    @property
    def args(self) -> list[str]:
        return ["--state", self.where] if isinstance(self.where, str) else []

    def _read(self, query: str) -> tuple[Any, ...] | None:
        """One row of ``query`` on the PostgreSQL state, on a connection kept open (a poll
        every few milliseconds: a connection each would load the server); None while the state
        is not there."""
        assert isinstance(self.where, str)
        base, _, name = self.where.partition("#")
        try:
            if self._conn is None:
                self._conn = psycopg.connect(base, autocommit=True)
                (current,) = self._conn.execute("SELECT current_schema()").fetchone()
                self._schema = f"{current}_ft_{name or 'run'}"
            row = self._conn.execute(query.format(s=f'"{self._schema}"', n=self._schema)).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        except psycopg.OperationalError:
            self.close()
            return None
        return tuple(row) if row else None

    def taken(self) -> tuple[int, int, int]:
        if isinstance(self.where, Path):
            return taken_in(self.where)
        row = self._read(_TAKEN)
        return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)

    def marks(self) -> tuple[int, int, int]:
        if isinstance(self.where, Path):
            return job_marks(self.where)
        row = self._read(_MARKS)
        return (int(row[0]), int(row[1]), int(row[2])) if row else (-1, 0, 0)

    def exists(self) -> bool:
        if isinstance(self.where, Path):
            return self.where.exists()
        row = self._read("SELECT count(*) FROM pg_namespace WHERE nspname = '{n}'")
        return bool(row and row[0])

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def deleter_of(out: Path, state: StateProbe) -> Callable[[], None]:
    """Deletes the results or rejects file once while it is empty and the run has rows in."""
    done: list[bool] = []

    def tick() -> None:
        if done or state.taken()[0] == 0:
            return
        for path in (out.with_suffix(".rej"), out):
            try:
                if path.stat().st_size == 0:
                    path.unlink()
                    done.append(True)
                    return
            except FileNotFoundError:
                pass

    return tick
