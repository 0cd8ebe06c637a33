"""Catalogue manifests as e-commerce teams export them, fed to ``fashiontag run`` (each test
failed before its fix): every row has one outcome, or the manifest is refused saying what to
fix; never rows lost, ids changed or a file read as something else."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
import zipfile
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine.source import open_manifest
from fashiontag_pipeline.engine.validate import Validator
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, read_outcomes, run_args, run_piped

#: A brand opened with a quote that no quote closes (an exporter that does not escape them),
#: a few rows before the end of a small manifest: the csv module read every row after it into
#: that field, row 2 tagged with them as its brand and rows 3 to 5 neither tagged nor rejected.
UNCLOSED = (
    "id,url,brand\n"
    "1,https://x/1.jpg,acme\n"
    "2,https://x/2.jpg,\"Levi's\n"
    "3,https://x/3.jpg,acme\n"
    "4,https://x/4.jpg,acme\n"
    "5,https://x/5.jpg,acme"
)
#: The same stray quote, and a quoted brand two rows below: the csv module took its opening
#: quote for the stray one's end (a quote followed by a letter, not by a comma or a line end),
#: so rows 3 and 4 were row 2's brand, without an outcome, wherever the manifest ends.
CLOSED_LATER = UNCLOSED.replace("4,https://x/4.jpg,acme", '4,https://x/4.jpg,"Tommy"')


@pytest.mark.parametrize(
    ("text", "how", "reason"),
    [
        (UNCLOSED, "file", "not closed by the end of the manifest"),
        (UNCLOSED, "stdin", "not closed by the end of the manifest"),
        (CLOSED_LATER, "file", "on line 5 a quote that ends a field is followed"),
    ],
    ids=["unclosed-file", "unclosed-stdin", "closed-later"],
)
async def test_a_stray_quote_costs_its_row_not_the_rows_after_it(
    tmp_path: Path, text: str, how: str, reason: str
) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text(text)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        if how == "file":
            args = run_args(svc.url, out, str(manifest))
            result = await anyio.run_process(args, check=False, env=ENV)
        else:
            result = await run_piped(run_args(svc.url, out, "-"), manifest)
    assert result.returncode == 0, result.stderr.decode()[-400:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(o.ids) == ["1", "3", "4", "5"]
    assert [(r["id"], r["line"]) for r in o.rejects] == [(None, 3)]  # its id is unreadable
    assert reason in o.rejects[0]["reason"]


@pytest.mark.parametrize("header", ["ID,URL,BRAND", "Id,Url,Brand", "url,id,Brand"])
async def test_a_header_in_capitals_is_read(tmp_path: Path, header: str) -> None:
    """A header spelled ``ID,URL`` (an Excel or ERP export) was refused as "missing column: id,
    url", naming columns the file has; ``id,url,Brand`` tagged every row without its brand, the
    column ignored without a word. The columns the engine reads are named in any case."""
    names = header.lower().split(",")
    rows = {"id": "p{}", "url": "https://x/{}.jpg", "brand": "acme"}
    lines = [header] + [",".join(rows[c].format(i) for c in names) for i in range(30)]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")
    reader = open_manifest(str(manifest), 0)
    try:
        batch = reader.read_batch()
        assert batch is not None
        items, rejects = Validator().validate(batch)
    finally:
        reader.close()
    assert not rejects and {request.context.brand for _, _, request in items} == {"acme"}
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
    assert result.returncode == 0, result.stderr.decode()[-400:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(30))


ROWS = "1{0}https://x/1.jpg\r\n2{0}https://x/2.jpg\r\n"


def _tarred(data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        info = tarfile.TarInfo("m.csv")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zipped(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m.csv", data)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("data", "fix"),
    [
        (f"id;url\r\n{ROWS.format(';')}".encode(), "separated by semicolons"),
        (f"sep=;\r\nid;url\r\n{ROWS.format(';')}".encode(), "Excel's sep=; line"),
        (f"id\turl\n{ROWS.format(chr(9))}".encode(), "tab-separated"),
        (f"id\turl\r\n{ROWS.format(chr(9))}".encode("utf-16"), "UTF-16"),
        (f"id,url\r\n{ROWS.format(',')}".encode("utf-16-le"), "UTF-16"),
        (
            '{"id": "1", "url": "https://x/1.jpg"}\r\n{"id": "2", "url": "https://x/2.jpg"}\r\n'.encode(
                "utf-16-le"
            ),
            "UTF-16",
        ),
        (b'{\n  "id": "1",\n  "url": "https://x/1.jpg"\n}\n{\n  "id": "2"\n}\n', "pretty-printed"),
        (b'[{"id": "1", "url": "https://x/1.jpg"}]\n', "a JSON array"),
        (b'[\n  {"id": "1", "url": "https://x/1.jpg"}\n]\n', "a JSON array"),
        (ROWS.format(",").encode(), "has no header: its first line is a row"),
        (ROWS.format("\t").encode(), "is tab-separated, with no header"),
        (ROWS.format(";").encode(), "is separated by semicolons, with no header"),
        (_zipped(f"id,url\n{ROWS.format(',')}".encode()), "a ZIP archive"),
        (bz2.compress(f"id,url\n{ROWS.format(',')}".encode()), "bzip2-compressed"),
        (lzma.compress(f"id,url\n{ROWS.format(',')}".encode()), "xz-compressed"),
        (bz2.compress(f"id,url\n{ROWS.format(',')}".encode(), 1), "bzip2-compressed"),
        (_tarred(f"id,url\n{ROWS.format(',')}".encode()), "a tar archive"),
        (gzip.compress(_tarred(f"id,url\n{ROWS.format(',')}".encode())), "a tar archive"),
        (_tarred(b'{"id": "1", "url": "https://x/1.jpg"}\n'), "a tar archive"),
        (gzip.compress(gzip.compress(f"id,url\n{ROWS.format(',')}".encode())), "gzipped twice"),
        (bytes.fromhex("d0cf11e0a1b11ae1") + bytes(504), "an Excel 97-2003 workbook"),
        (b"PAR1\x15\x04\x15\x10\x15\x14L\x15\x02" + bytes(64), "a Parquet file"),
        (b"Obj\x01\x04\x14avro.codec\x08null" + bytes(64), "an Avro file"),
    ],
    ids=[
        "semicolons",
        "sep-line",
        "tabs",
        "utf-16",
        "utf-16-no-bom",
        "utf-16-jsonl-no-bom",
        "json-pretty-objects",
        "json",
        "json-pretty",
        "no-header",
        "no-header-tabs",
        "no-header-semicolons",
        "zip",
        "bz2",
        "xz",
        "bz2-level-1",
        "tar",
        "tar-gz",
        "tar-jsonl",
        "gzip-twice",
        "xls",
        "parquet",
        "avro",
    ],
)
async def test_a_manifest_of_another_dialect_is_refused_saying_what_to_fix(
    tmp_path: Path, data: bytes, fix: str
) -> None:
    """Excel's CSV in a locale with a decimal comma (semicolons, a ``sep=;`` first line), its
    Unicode text (UTF-16, tabs), a JSON array, a dump without its header: each was refused as
    "neither JSONL nor a CSV with a header naming id and url (missing column: id, url)" (or
    "its first line is not UTF-8 text"), which names columns the file has and no fix (and a
    ZIP, bzip2 or xz archive, not read, was "not UTF-8 text"). JSONL in UTF-16 without a BOM
    (SQL Server's ``bcp -w``) was read as JSONL, every line a "not valid JSON" reject (and one
    more for the last line end's second byte), exit 0; a database dump of tab-separated rows
    with no header (MySQL's ``INTO OUTFILE``) was "missing column: id, url"; objects
    pretty-printed one after another (``jq .`` without ``-c``) were a reject per line, none per
    object. A CSV in a tar archive (``tar czf``) was refused as "missing column: id", naming a
    column the CSV has, and a dump gzipped twice, an ``.xls`` workbook, a Parquet or Avro unload
    (BigQuery, Snowflake) as "not UTF-8 text": each now says what the file is."""
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(data)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
        assert not svc.store.tasks
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err, err[-400:]
    assert f"manifest {manifest}" in err and fix in err, err


@pytest.mark.parametrize("kind", ["csv", "jsonl", "urls"])
async def test_a_latin1_byte_in_an_id_on_stdin_is_one_reject_not_a_crash(
    tmp_path: Path, kind: str
) -> None:
    """A dump piped to ``fashiontag run -`` with a Latin-1 byte in an id or URL (``caf\\xe9``)
    stopped the run with a TypeError traceback (exit 1, no row written): the row the source
    refuses could not be digested for a resume. It is one reject, the other rows tagged."""
    rows = [(f"p{i}", f"https://x/{i}.jpg") for i in range(8)] + [("caf\xe9", "https://x/c.jpg")]
    if kind == "csv":
        text = "id,url\n" + "".join(f"{i},{u}\n" for i, u in rows)
    elif kind == "jsonl":
        text = "".join(f'{{"id": "{i}", "url": "{u}"}}\n' for i, u in rows)
    else:
        rows = [(u, u) for _, u in rows[:-1]] + [("", "https://x/caf\xe9.jpg")]
        text = "".join(f"{u}\n" for _, u in rows)
    manifest = tmp_path / "m.txt"
    manifest.write_bytes(text.encode("latin-1"))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await run_piped(run_args(svc.url, out, "-"), manifest)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), {i for i, _ in rows[:-1]} | {None})
    assert "not UTF-8 text" in o.rejects[0]["reason"]


@pytest.mark.parametrize("stray", [False, True], ids=["utf8", "latin1-byte"])
async def test_a_jsonl_line_nested_too_deep_is_one_reject_not_a_crash(
    tmp_path: Path, stray: bool
) -> None:
    """A JSONL line with a value nested thousands of levels deep (a runaway serializer) stopped
    the run with a RecursionError traceback (exit 1, nothing tagged), the JSON decoder's error
    for it not being the one the source took for a line that is not JSON. It is one reject."""
    deep = "[" * 5000 + "]" * 5000
    lines = [f'{{"id": "p{i}", "url": "https://x/{i}.jpg"}}' for i in range(6)]
    brand = "Herm\xe8s" if stray else "Hermes"  # (a Latin-1 byte: the line is screened)
    lines.insert(3, f'{{"id": "deep", "url": "https://x/d.jpg", "brand": "{brand}", "m": {deep}}}')
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(6) | {None})
    assert [(r["line"], r["reason"][:15]) for r in o.rejects] == [(4, "not valid JSON:")]


@pytest.mark.parametrize(
    ("id_key", "url_key", "in_context"),
    [("ID", "url", False), ("Id", "URL", True), ("id", "URL", False)],
    ids=["ID", "context-Id", "URL"],
)
async def test_a_latin1_byte_under_a_key_in_capitals_is_refused_not_replaced(
    tmp_path: Path, id_key: str, url_key: str, in_context: bool
) -> None:
    """A JSONL export in Latin-1 whose keys are in capitals (``{"ID": "caf\\xe9", ...}``, a SQL
    Server or ERP dump) had the stray byte in its id (or URL) replaced by U+FFFD, where the same
    row under ``id`` is refused: ``caf\\xe9`` and ``caf\\xe8`` were both tagged as ``caf\\ufffd``
    (an id the catalogue does not have), the second a duplicate-id reject, and a URL was sent
    changed. The keys are read in any case here too: each such row is one reject."""
    bad = ["caf\xe9", "caf\xe8"] if url_key == "url" else ["p8", "p9"]
    lines = []
    for i, ident in enumerate([f"p{i}" for i in range(8)] + bad):
        url = f"https://x/{i}.jpg" if url_key == "url" or i < 8 else f"https://x/caf\xe9{i}.jpg"
        row = {url_key: url}
        if in_context:
            row["context"] = {id_key: ident}  # type: ignore[assignment]
        else:
            row[id_key] = ident
        lines.append(json.dumps(row, ensure_ascii=False))
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert "Traceback" not in err, err[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(o.ids) == sorted(ids_of(8)), o.rejects
    what = "url" if url_key == "URL" else "id"
    assert [(r["line"], r["reason"]) for r in o.rejects] == [
        (line, f"not UTF-8 text (in the {what}): save the manifest as UTF-8") for line in (9, 10)
    ]


@pytest.mark.parametrize("how", ["file", "stdin"])
async def test_a_header_repeated_by_concatenated_parts_is_one_clear_reject(
    tmp_path: Path, how: str
) -> None:
    """A warehouse export split into parts (BigQuery's ``part-*.csv``, each with its header, the
    later ones with a BOM from another tool) joined with ``cat`` into one manifest or one pipe:
    each repeated header line was a row with the id ``id`` (or ``\\ufeffid``) whose url ``url``
    was taken for a local path, rejected as ``local file not found: /the/cwd/url``, which
    names no file of the user's. Each is now one reject saying the header is repeated."""
    parts = []
    for k in range(3):
        rows = "".join(f"p{k * 4 + i},https://x/{k}-{i}.jpg,acme\n" for i in range(4))
        parts.append(("\ufeff" if k == 2 else "") + "ID,Url,brand\n" + rows)
    manifest = tmp_path / "m.csv"
    manifest.write_text("".join(parts), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-" if how == "stdin" else str(manifest))
        if how == "stdin":
            result = await run_piped(args, manifest)
        else:
            result = await anyio.run_process(args, check=False, env=ENV, cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(o.ids) == sorted(ids_of(12))
    assert [(r["line"], r["reason"][:41]) for r in o.rejects] == [
        (line, "row repeats the header (manifests joined ") for line in (6, 11)
    ]


@pytest.mark.parametrize("kind", ["csv", "quoted-csv", "jsonl", "urls"])
async def test_a_manifest_with_two_byte_order_marks_is_read(tmp_path: Path, kind: str) -> None:
    """A manifest read as UTF-8 with its BOM kept as text and written again as UTF-8 with a BOM
    (Python's ``open(encoding="utf-8")`` then ``"utf-8-sig"``; a converter run twice) starts
    with two BOMs: the first was dropped, the second taken for text, and the manifest refused
    as "a CSV with a header naming id and url (missing column: id)", its header plainly
    naming id; JSONL and URL lists were refused as CSV. Leading BOMs are all dropped now."""
    rows = [(f"p{i}", f"https://x/{i}.jpg") for i in range(5)]
    if kind == "csv":
        text = "id,url\n" + "".join(f"{i},{u}\n" for i, u in rows)
    elif kind == "quoted-csv":
        text = '"id","url"\r\n' + "".join(f'"{i}","{u}"\r\n' for i, u in rows)
    elif kind == "jsonl":
        text = "".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows)
    else:
        text = "".join(f"{u}\n" for _, u in rows)
    manifest = tmp_path / "m.txt"
    manifest.write_text("\ufeff\ufeff" + text, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    expected = {u for _, u in rows} if kind == "urls" else ids_of(5)
    assert_exactly_once(out, out.with_suffix(".rej"), expected)


@pytest.mark.parametrize(
    "header",
    [
        'id,url,"Retail Price\nin EUR",brand',
        '"Product\nName",ID,URL,Brand',
        'id,url,brand,"a\r\nb"',
    ],
    ids=["middle", "first", "last-crlf"],
)
@pytest.mark.parametrize("how", ["file", "stdin"])
async def test_a_header_cell_with_a_line_break_is_one_header(
    tmp_path: Path, header: str, how: str
) -> None:
    """A header cell holding a line break (Alt+Enter in an Excel cell, ``"Retail Price\\nin
    EUR"``: Excel quotes it) made the header its first line only: the columns after the cell
    were not in it, so every row was rejected for its field count (``row has 4 fields, the
    header has 3``, exit 0, nothing tagged) and the cell's second line was a reject of its
    own; with the cell first, the manifest was refused as missing id and url. The header is
    the first CSV record, whatever lines it spans."""
    names = [n.strip('"').lower() for n in header.replace("\r\n", "\n").split(",")]
    values = {"id": "p{}", "url": "https://x/{}.jpg", "brand": "acme"}
    lines = [",".join(values.get(n, "9").format(i) for n in names) for i in range(6)]
    lines[3] = lines[3].replace("https://x/3.jpg", "ftp://x/3.jpg")  # (a reject: its line)
    manifest = tmp_path / "m.csv"
    manifest.write_bytes((header + "\r\n" + "\r\n".join(lines) + "\r\n").encode())
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-" if how == "stdin" else str(manifest))
        if how == "stdin":
            result = await run_piped(args, manifest)
        else:
            result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(6))
    assert sorted(o.ids) == sorted(ids_of(6) - {"p3"})
    assert [(r["id"], r["line"]) for r in o.rejects] == [("p3", 6)]
    reader = open_manifest(str(manifest), 0)
    try:
        batch = reader.read_batch()
        assert batch is not None
        items, _ = Validator().validate(batch)
    finally:
        reader.close()
    assert {request.context.brand for _, _, request in items} == {"acme"}


@pytest.mark.parametrize("kind", ["csv", "jsonl", "urls"])
@pytest.mark.parametrize("how", ["file", "stdin"])
async def test_parts_joined_with_their_byte_order_marks_keep_their_ids(
    tmp_path: Path, kind: str, how: str
) -> None:
    """Parts of an export written with a BOM each (a Windows tool's UTF-8) and joined with
    ``cat`` (the later CSV parts without a header) have a BOM at the start of each later part's
    first line: a CSV id was tagged with the BOM in it (``\\ufeffp4``, and ``\\ufeff"p4"`` with
    its quotes when quoted: ids the catalogue does not have, in silence), a JSONL row was a
    ``not valid JSON`` reject, and a URL was taken for a local file. A BOM at a line's start is
    dropped, as at the file's."""
    rows = [(f"p{i}", f"https://x/{i}.jpg") for i in range(9)]

    def line(k: int) -> str:
        ident, url = rows[k]
        if kind == "csv":
            return f'"{ident}","{url}"' if k == 6 else f"{ident},{url}"
        if kind == "jsonl":
            return json.dumps({"id": ident, "url": url})
        return url

    parts = ["\ufeff" + "".join(line(k) + "\r\n" for k in range(s, s + 3)) for s in (0, 3, 6)]
    head = "id,url\r\n" if kind == "csv" else ""
    manifest = tmp_path / "m.txt"
    manifest.write_text(head + "".join(parts), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-" if how == "stdin" else str(manifest))
        if how == "stdin":
            result = await run_piped(args, manifest)
        else:
            result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    expected = {u for _, u in rows} if kind == "urls" else {i for i, _ in rows}
    o = assert_exactly_once(out, out.with_suffix(".rej"), expected)
    assert o.rejects == []


@pytest.mark.parametrize("tail", [b"\x1a", b"\x00" * 509], ids=["ctrl-z", "nul-padding"])
@pytest.mark.parametrize("kind", ["csv", "jsonl", "urls"])
@pytest.mark.parametrize("how", ["file", "stdin"])
async def test_an_end_of_file_mark_or_padding_after_the_last_line_is_no_row(
    tmp_path: Path, tail: bytes, kind: str, how: str
) -> None:
    """A dump ending with a DOS end-of-file mark (Ctrl-Z, ``\\x1a``, after its last line: an
    old ERP's export) or NUL bytes padding it to a block (a tape or block device's, ``dd
    conv=sync``; gzip and zcat skip them after gzip data, and so does the run) had that tail
    read as one more row: a reject with the id ``\\x1a`` or 509 NULs and ``row has 1 fields``,
    ``not valid JSON`` or a local file, every night, and on stdin a warning that the stream
    was cut. It is no row now."""
    rows = [(f"p{i}", f"https://x/{i}.jpg") for i in range(4)]
    if kind == "csv":
        text = "id,url\r\n" + "".join(f"{i},{u}\r\n" for i, u in rows)
    elif kind == "jsonl":
        text = "".join(json.dumps({"id": i, "url": u}) + "\r\n" for i, u in rows)
    else:
        text = "".join(f"{u}\r\n" for _, u in rows)
    manifest = tmp_path / "m.txt"
    manifest.write_bytes(text.encode() + tail)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-" if how == "stdin" else str(manifest))
        if how == "stdin":
            result = await run_piped(args, manifest)
        else:
            result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    assert "without a line end" not in err, err[-600:]
    expected = {u for _, u in rows} if kind == "urls" else {i for i, _ in rows}
    o = assert_exactly_once(out, out.with_suffix(".rej"), expected)
    assert o.rejects == []
