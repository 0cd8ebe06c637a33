"""Manifests as data warehouses unload them, byte for byte as their tools write them."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, read_outcomes, run_args, run_piped
from .strict import StrictFront


def _sent(front: StrictFront) -> dict[str, dict[str, Any]]:
    """The context of every bulk request the engine sent, by id."""
    return {
        r["context"]["id"]: r["context"]
        for _, path, body in front.bodies
        if path.endswith("/bulk") or "/bulk/" in path
        for r in body.get("taggingRequest", [])
    }


#: ``COPY INTO @stage FROM products FILE_FORMAT = (TYPE = CSV COMPRESSION = GZIP
#: FIELD_OPTIONALLY_ENCLOSED_BY = '"') HEADER = TRUE``: text enclosed in quotes, a SQL NULL
#: written ``\N`` unenclosed (the default ``NULL_IF``), as PostgreSQL's and MySQL's text
#: exports write it too.
SNOWFLAKE = (
    b"ID,URL,BRAND,DETECTION\n"
    b'"p1","https://img.example/1.jpg",\\N,\\N\n'
    b'"p2","https://img.example/2.jpg","acme",\\N\n'
    b'\\N,"https://img.example/3.jpg","acme","TOP"\n'
    b'\\N,"https://img.example/4.jpg",\\N,\\N\n'
    b'"p5",\\N,"acme",\\N\n'
    b'"p6","https://img.example/6.jpg",\\N,"SHOES"\n'
)


@pytest.mark.parametrize("given", ["file", "stdin", "unquoted"])
async def test_a_sql_null_written_backslash_n_is_no_value(tmp_path: Path, given: str) -> None:
    """A Snowflake unload with the default ``NULL_IF`` (``\\N`` for a SQL NULL) had every row
    whose ``detection`` was NULL refused (``invalid detection value '\\\\N'``), a NULL brand
    sent to the service as the brand ``\\N``, and a row whose id was NULL tagged under the id
    ``\\N`` (every later one a ``duplicate id`` reject). A ``\\N`` cell is no value, as an
    empty one is: the id or URL is missing, a context field is not sent."""
    data = SNOWFLAKE if given != "unquoted" else SNOWFLAKE.replace(b'"', b"")
    manifest = tmp_path / "data_0_0_0.csv.gz"
    manifest.write_bytes(gzip.compress(data))
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc, StrictFront(svc.url).running() as front:
        if given == "stdin":
            result = await run_piped(run_args(front.url, out, "-"), manifest)
        else:
            args = run_args(front.url, out, str(manifest))
            result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(r["id"] for r in o.results) == ["p1", "p2", "p6"]
    assert sorted((r["line"], r["id"], r["reason"]) for r in o.rejects) == [
        (4, None, "id is missing"),
        (5, None, "id is missing"),
        (6, "p5", "url is missing"),
    ]
    assert _sent(front) == {
        "p1": {"id": "p1"},
        "p2": {"id": "p2", "brand": "acme"},
        "p6": {"id": "p6", "detection": ["SHOES"]},
    }
