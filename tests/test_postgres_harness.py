"""The tests' PostgreSQL: a real server, one database per test, restarts that keep the data."""

from __future__ import annotations

import psycopg
import pytest

from .postgres import PostgresCluster


@pytest.mark.parametrize("create", ["create_schema", "create_database"])
def test_each_test_gets_its_own_empty_namespace(
    postgres_cluster: PostgresCluster, create: str
) -> None:
    first, second = getattr(postgres_cluster, create)(), getattr(postgres_cluster, create)()
    assert first != second
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("CREATE TABLE IF NOT EXISTS t (x int)")
    with psycopg.connect(second, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('t')").fetchone() == (None,)
        conn.execute("CREATE TABLE t (x int)")  # its own t, not the first one's


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_breaks_connections_and_keeps_committed_data(
    postgres_cluster: PostgresCluster, postgres_url: str, mode: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (1)")
        postgres_cluster.restart(mode)  # type: ignore[arg-type]
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
