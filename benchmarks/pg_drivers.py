"""psycopg 3 against asyncpg on the statements the state store runs (the choice of driver).

Starts a throwaway PostgreSQL (the tests' harness: the pgserver wheel, a Unix socket) and times,
for each driver, in asyncio: small single-statement transactions (lease renewals), transactions
of one page of rows each (checkpoint commits) and a COPY of many rows. Prints wall time and
this process's CPU time (the client's cost; the server runs beside it).

    .venv/bin/pip install asyncpg   # not a dependency: only this comparison needs it
    .venv/bin/python -m benchmarks.pg_drivers
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

SMALL = 2000
PAGES = 200
PAGE_ROWS = 100
COPY_ROWS = 100_000

DDL = """
CREATE TABLE lease (id bigint PRIMARY KEY, owner text, epoch bigint, expires timestamptz);
INSERT INTO lease SELECT g, 'a', 1, now() FROM generate_series(1, 100) g;
CREATE TABLE outcome (manifest bigint, pos bigint, id text, body bytea,
                      PRIMARY KEY (manifest, pos));
"""
RENEW = (
    "UPDATE lease SET expires = statement_timestamp() + interval '30 s' "
    "WHERE id = {p1} AND owner = {p2} AND epoch = {p3} RETURNING expires"
)
INSERT = "INSERT INTO outcome (manifest, pos, id, body) VALUES ({p1}, {p2}, {p3}, {p4})"
#: One statement per page (arrays in, ON CONFLICT for dedupe, which COPY cannot do).
UNNEST = (
    "INSERT INTO outcome (manifest, pos, id, body) SELECT * FROM "
    "unnest({p1}::bigint[], {p2}::bigint[], {p3}::text[], {p4}::bytea[]) ON CONFLICT DO NOTHING"
)


def rows(page: int, n: int) -> list[tuple[int, int, str, bytes]]:
    return [(page, page * n + i, f"sku-{page}-{i}", b'{"status":"success"}' * 4) for i in range(n)]


def columns(page: int, n: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows(page, n), strict=True)]


async def timed(label: str, work: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    cpu, wall = time.process_time(), time.perf_counter()
    await work()
    return {
        "case": label,
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
    }


async def with_psycopg(url: str) -> list[dict[str, Any]]:
    import psycopg

    out = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DROP TABLE IF EXISTS lease, outcome")
        for statement in DDL.strip().split(";\n"):
            await conn.execute(statement)
        renew = RENEW.format(p1="%s", p2="%s", p3="%s")
        insert = INSERT.format(p1="%s", p2="%s", p3="%s", p4="%s")
        unnest = UNNEST.format(p1="%s", p2="%s", p3="%s", p4="%s")

        async def small() -> None:
            for i in range(SMALL):
                await (await conn.execute(renew, (i % 100 + 1, "a", 1))).fetchone()

        async def pages() -> None:
            for page in range(PAGES):
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.executemany(insert, rows(page, PAGE_ROWS))

        async def arrays() -> None:
            for page in range(PAGES, 2 * PAGES):
                async with conn.transaction():
                    await conn.execute(unnest, columns(page, PAGE_ROWS))

        async def copy() -> None:
            async with (
                conn.cursor() as cur,
                cur.copy("COPY outcome (manifest, pos, id, body) FROM STDIN") as cp,
            ):
                for row in rows(10**6, COPY_ROWS):
                    await cp.write_row(row)

        out.append(await timed(f"{SMALL} single-statement transactions", small))
        out.append(await timed(f"{PAGES} transactions of {PAGE_ROWS} rows", pages))
        out.append(await timed(f"{PAGES} x {PAGE_ROWS} rows as arrays", arrays))
        out.append(await timed(f"COPY {COPY_ROWS} rows", copy))
    return out


async def with_asyncpg(url: str) -> list[dict[str, Any]]:
    import asyncpg  # type: ignore[import-not-found]

    out = []
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TABLE IF EXISTS lease, outcome")
        await conn.execute(DDL)
        renew = RENEW.format(p1="$1", p2="$2", p3="$3")
        insert = INSERT.format(p1="$1", p2="$2", p3="$3", p4="$4")
        unnest = UNNEST.format(p1="$1", p2="$2", p3="$3", p4="$4")

        async def small() -> None:
            for i in range(SMALL):
                await conn.fetchrow(renew, i % 100 + 1, "a", 1)

        async def pages() -> None:
            for page in range(PAGES):
                async with conn.transaction():
                    await conn.executemany(insert, rows(page, PAGE_ROWS))

        async def arrays() -> None:
            for page in range(PAGES, 2 * PAGES):
                async with conn.transaction():
                    await conn.execute(unnest, *columns(page, PAGE_ROWS))

        async def copy() -> None:
            await conn.copy_records_to_table(
                "outcome", records=rows(10**6, COPY_ROWS), columns=["manifest", "pos", "id", "body"]
            )

        out.append(await timed(f"{SMALL} single-statement transactions", small))
        out.append(await timed(f"{PAGES} transactions of {PAGE_ROWS} rows", pages))
        out.append(await timed(f"{PAGES} x {PAGE_ROWS} rows as arrays", arrays))
        out.append(await timed(f"COPY {COPY_ROWS} rows", copy))
    finally:
        await conn.close()
    return out


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    try:
        cluster.start()
        for name, bench in (("psycopg", with_psycopg), ("asyncpg", with_asyncpg)):
            for result in asyncio.run(bench(cluster.create_database("bench"))):
                print(
                    f"{name:8} {result['case']:40} wall {result['wall_s']:7.3f} s"
                    f"  cpu {result['cpu_s']:7.3f} s"
                )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
