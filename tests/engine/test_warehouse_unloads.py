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


def _spark_folder(folder: Path, suffix: str) -> list[Path]:
    """A Spark (Databricks) ``df.write.csv(folder, header=True)`` output: part files, the
    ``_SUCCESS`` marker (empty) and a hidden ``.crc`` beside each."""
    folder.mkdir()
    parts = []
    for n in range(2):
        part = folder / f"part-0000{n}-3f2a9c1e-8d7b-4e2f-9a61-5c0d2b7e4f18-c000{suffix}"
        data = f"id,url\np{n},https://img.example/{n}.jpg\n".encode()
        if suffix == ".json":  # (df.write.json: JSON lines)
            data = f'{{"id":"p{n}","url":"https://img.example/{n}.jpg"}}\n'.encode()
        part.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        (folder / f".{part.name}.crc").write_bytes(b"crc\x00\x00\x00\x01")
        parts.append(part)
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / "._SUCCESS.crc").write_bytes(b"crc\x00")
    return parts


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".json"])
async def test_a_spark_output_folder_is_refused_saying_which_files_to_give(
    tmp_path: Path, suffix: str
) -> None:
    """``fashiontag run out.csv/`` (Spark's output folder): it said to give ``out.csv/*.csv``,
    which names none of the files when the parts are ``.csv.gz`` (``compression=gzip``) or
    ``.json`` (the shell passes the pattern on, a "No such file" error); and ``out.csv/*``
    was refused as ``manifest out.csv/_SUCCESS is empty``, not saying that file is no
    manifest. Both name the part files to give; nothing is sent."""
    folder = tmp_path / "out.csv"
    parts = _spark_folder(folder, suffix)
    out = tmp_path / "results.jsonl"
    pattern = f"{folder}/*{suffix}"
    assert sorted(folder.glob(f"*{suffix}")) == parts  # (the pattern the message says)
    for given in ([str(folder)], [*map(str, parts), str(folder / "_SUCCESS")]):
        args = run_args("http://127.0.0.1:9", out, *given)
        result = await anyio.run_process(args, check=False, env=ENV)
        err = result.stderr.decode()
        assert result.returncode == 1, err
        assert pattern in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert "_SUCCESS" in err and "marker" in err, err


async def test_a_comma_escaped_with_a_backslash_is_a_reject_saying_how_to_unload(
    tmp_path: Path,
) -> None:
    """A Snowflake unload without ``FIELD_OPTIONALLY_ENCLOSED_BY`` (its default) escapes a
    comma in a value with a backslash (``ESCAPE_UNENCLOSED_FIELD``): a brand ``Dolce\\,
    Gabbana``, a Cloudinary URL's ``w_300\\,h_300``. Each such row was a reject saying only
    ``row has 4 fields, the header has 3``, which does not say why. The reason names the
    escaped comma and how to unload the file instead; the other rows are tagged."""
    manifest = tmp_path / "data_0_0_0.csv.gz"
    manifest.write_bytes(
        gzip.compress(
            b"ID,URL,BRAND\n"
            b"p1,https://res.cloudinary.example/image/upload/w_300\\,h_300/a.jpg,acme\n"
            b"p2,https://img.example/2.jpg,Dolce\\, Gabbana\n"
            b"p3,https://img.example/3.jpg,acme\n"
            b"p4,https://img.example/4.jpg,acme,x\n"
        )
    )
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert [r["id"] for r in o.results] == ["p3"]
    escaped = (
        "row has 4 fields, the header has 3 (a comma escaped as \\, in an unquoted field:"
        " Snowflake's ESCAPE_UNENCLOSED_FIELD; unload with FIELD_OPTIONALLY_ENCLOSED_BY = '\"')"
    )
    assert [(r["id"], r["reason"]) for r in o.rejects] == [
        ("p1", escaped),
        ("p2", escaped),
        ("p4", "row has 4 fields, the header has 3"),
    ]


async def test_a_quote_escaped_with_a_backslash_is_a_reject_not_a_changed_value(
    tmp_path: Path,
) -> None:
    """Spark (Databricks) writes CSV with ``escape`` ``\\`` by default: a brand ``Levi"s`` is
    ``"Levi\\"s"``, a keyword ``32" waist`` is ``"32\\" waist"``. The csv module, lenient,
    read the first as ``Levi\\s"`` and sent that to the service (a silent wrong value), and a
    value holding a comma after the quote split its row. Such a row is a reject naming the
    escaped quote and how to write the file; the other rows are tagged."""
    part = tmp_path / "part-00000-3f2a9c1e-8d7b-4e2f-9a61-5c0d2b7e4f18-c000.csv"
    part.write_bytes(
        b"id,url,brand,keywords\n"
        b'p1,https://img.example/1.jpg,"Levi\\"s",denim\n'
        b'p2,https://img.example/2.jpg,acme,"shirt, ""oxford"""\n'
        b'p3,https://img.example/3.jpg,acme,"jeans, 32\\" waist"\n'
        b'p4,https://img.example/4.jpg,acme,"C:\\\\"\n'
    )
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc, StrictFront(svc.url).running() as front:
        result = await anyio.run_process(run_args(front.url, out, str(part)), check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(r["id"] for r in o.results) == ["p2", "p4"]
    assert [(r["line"], r["reason"]) for r in o.rejects] == [(2, ESCAPED), (4, ESCAPED)]
    assert _sent(front) == {
        "p2": {"id": "p2", "brand": "acme", "keywords": 'shirt, "oxford"'},
        "p4": {"id": "p4", "brand": "acme", "keywords": "C:\\\\"},
    }


ESCAPED = (
    'not a valid CSV row: a quote escaped with a backslash (\\") in a quoted field, as Spark'
    ' writes CSV by default: write it with the option escape set to \'"\' (a quote doubled, "")'
)
