"""Fixtures shared by every test folder: a real PostgreSQL (started once per session, only when
a test asks for it) and a fresh schema per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .postgres import PostgresCluster


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """The session's PostgreSQL server. Tests may stop or restart it (``restart()``): the next
    test that asks for a database gets it running again."""
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """The URL of a new, empty schema on the session's server: the URL's connections see only
    that schema (its search_path), so to the code under test it is a database of its own."""
    if not postgres_cluster.running:
        postgres_cluster.start()  # an earlier test stopped it and failed before starting it
    return postgres_cluster.create_schema()


@pytest.fixture(params=["sqlite", "postgresql"])
def state_location(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Path | str]:
    """Where a test keeps a run's state, once per backend: ``state_location(name)`` is a SQLite
    file in the test's folder, or the state ``name`` in a fresh PostgreSQL schema of the
    session's server (the same tests run on both: the backends' contract)."""
    if request.param == "sqlite":
        return lambda name: tmp_path / f"{name}.state"
    url = request.getfixturevalue("postgres_url")
    return lambda name: f"{url}#{name}"
