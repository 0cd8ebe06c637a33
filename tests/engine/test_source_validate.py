"""Source and validation: formats, gzip, chunk boundaries, fatal manifests, bad rows."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fashiontag_pipeline import ManifestError
from fashiontag_pipeline.engine import manifest_bytes
from fashiontag_pipeline.engine.source import ManifestReader, iter_rows_sync, open_manifest
from fashiontag_pipeline.engine.validate import Validator


def _rows(path: Path) -> list[tuple[int, object]]:
    reader = open_manifest(str(path), 0)
    try:
        return list(iter_rows_sync(reader))
    finally:
        reader.close()


def test_csv_plain_and_gzip_give_the_same_rows(tmp_path: Path) -> None:
    text = "id,url\na,https://x/a.jpg\nb,https://x/b.jpg\n"
    plain = tmp_path / "m.csv"
    plain.write_text(text)
    packed = tmp_path / "m.bin"  # detected from magic bytes, not the name
    packed.write_bytes(gzip.compress(text[:10].encode()) + gzip.compress(text[10:].encode()))
    assert (
        _rows(plain)
        == _rows(packed)
        == [(2, ["a", "https://x/a.jpg"]), (3, ["b", "https://x/b.jpg"])]
    )


def test_jsonl_rows_and_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"id":"a","url":"https://x/a"}\n\nnot json\n{"id":"b","url":"https://x/b"}\n')
    rows = _rows(p)
    assert [line for line, _ in rows] == [1, 3, 4]
    assert isinstance(rows[1][1], str) and "not valid JSON" in rows[1][1]


def test_quoted_newline_across_read_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", 16)
    p = tmp_path / "m.csv"
    p.write_text('id,url,keywords\na,https://x/a,"one\ntwo, three"\nb,https://x/b,z\n')
    rows = _rows(p)
    assert rows == [(2, ["a", "https://x/a", "one\ntwo, three"]), (4, ["b", "https://x/b", "z"])]


def test_many_rows_in_small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", 1000)
    p = tmp_path / "m.csv.gz"
    p.write_bytes(
        gzip.compress(("id,url\n" + "".join(f"i{i},https://x/{i}\n" for i in range(5000))).encode())
    )
    rows = _rows(p)
    assert len(rows) == 5000 and rows[-1] == (5001, ["i4999", "https://x/4999"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"id,link\na,https://x\n", "missing column: url"),
        # A column read twice: which of the two holds the value is anybody's guess (the
        # last one was taken, in silence).
        (b"id,url,id\na,https://x,b\n", "names the column id twice"),
        (b"id,url,brand, brand\na,https://x,b,c\n", "names the column brand twice"),
        (b"id,url,productContentName,product_content_name\na,https://x,b,c\n", "both"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is a PNG image, not a manifest"),
        (b"", "empty"),
    ],
)
def test_unreadable_manifest_is_fatal(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "m.csv"
    p.write_bytes(content)
    with pytest.raises(ManifestError, match=message):
        open_manifest(str(p), 0)


def test_missing_file_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read manifest"):
        open_manifest(str(tmp_path / "nope.csv"), 0)


BAD_CSV_ROWS = {
    ",https://x/1.jpg,,": "id is missing",
    "u1,,,": "url is missing",
    "u2,ftp://x/2.jpg,,": "http:// or https://",
    "u3,https:///nohost.jpg,,": "not a valid",
    "u4,https://x/4.jpg,,HATS": "invalid detection value",
    "u5,https://x/5.jpg": "fields",
    "u6, https://x/6.jpg,,": "spaces around it",
}


def test_every_kind_of_bad_csv_row_is_one_reject(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text(
        "id,url,brand,detection\n" + "\n".join(BAD_CSV_ROWS) + "\nok,https://x/ok.jpg,b,TOP|BAG\n"
    )
    reader = open_manifest(str(p), 0)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None
    items, rejects = Validator().validate(batch)
    assert [i[0] for i in items] == ["ok"]
    assert items[0][2].context.detection == ["TOP", "BAG"]
    assert len(rejects) == len(BAD_CSV_ROWS)
    for (_, reject), expected in zip(rejects, BAD_CSV_ROWS.values(), strict=True):
        assert expected in reject.reason and reject.stage == "client"
    assert [r.line for _, r in rejects] == [2, 3, 4, 5, 6, 7, 8]


BAD_JSONL_ROWS = [
    ({"url": "https://x/1"}, "id is missing"),
    ({"id": 7.5, "url": "https://x/1"}, "id must be a string or an integer"),
    ({"id": "j1", "image": {"type": "base64", "content": "data:image/png;base64,AA"}}, "URLs only"),
    ({"id": "j2", "url": "https://x/2", "price": True}, "price must be a string or a number"),
    ({"id": "j3", "url": "https://x/3", "age": [None]}, "age must be a list of strings"),
    ({"id": "j4", "url": "https://x/4", "detection": "TOP"}, None),
    ({"id": "j5", "url": "https://x/5", "detection": ["SOCKS"]}, "invalid detection"),
    ([1, 2], "not a JSON object"),
    # A line that is a JSON string: its reject's reason was the string (a row's own text).
    ("SKU-1,https://x/1.jpg", "line is not a JSON object"),
]


def test_every_kind_of_bad_jsonl_row_is_one_reject(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(json.dumps(obj) for obj, _ in BAD_JSONL_ROWS) + "\n{broken\n")
    reader = open_manifest(str(p), 0)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None
    items, rejects = Validator().validate(batch)
    assert [i[0] for i in items] == ["j4"]
    expected = [m for _, m in BAD_JSONL_ROWS if m] + ["not valid JSON"]
    assert len(rejects) == len(expected)
    for (_, reject), message in zip(rejects, expected, strict=True):
        assert message in reject.reason


@pytest.mark.parametrize("broken", [False, True], ids=["decoded-whole", "line-by-line"])
def test_a_jsonl_line_that_is_a_json_string_is_not_an_object(tmp_path: Path, broken: bool) -> None:
    """A line holding a JSON string (``"SKU-1,https://x/1.jpg"``: a CSV row quoted by an
    exporter, a banner) was rejected with the string as its reason, read as the source's
    reason for a line it could not parse. Its reason says the line is not a JSON object,
    whether the block was decoded whole or line by line (a line that is not JSON in it)."""
    lines = ['{"id": "a", "url": "https://x/a.jpg"}', '"SKU-1,https://x/1.jpg"', '"p"']
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(lines + (["{broken"] if broken else [])) + "\n")
    reader = open_manifest(str(p), 0)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None
    items, rejects = Validator().validate(batch)
    assert [i[0] for i in items] == ["a"]
    reasons = [(r.line, r.reason) for _, r in rejects]
    assert reasons[:2] == [(2, "line is not a JSON object"), (3, "line is not a JSON object")]
    assert len(reasons) == 2 + broken


def test_csv_field_larger_than_the_csv_default_is_read(tmp_path: Path) -> None:
    """A data: URI of a ~300 KB image is one CSV field, past the csv module's 128 KiB default."""
    uri = "data:image/png;base64," + "A" * 400_000
    p = tmp_path / "m.csv"
    p.write_text(f'id,url\nbig,"{uri}"\nsmall,https://x/s.jpg\n')  # quoted: it has a comma
    assert _rows(p) == [(2, ["big", uri]), (3, ["small", "https://x/s.jpg"])]


def test_csv_row_the_parser_refuses_is_one_reject_and_the_rest_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import csv

    p = tmp_path / "m.csv"
    p.write_text("id,url\na,https://x/a.jpg\nhuge,https://x/" + "h" * 500 + "\nb,https://x/b.jpg\n")
    previous = csv.field_size_limit(100)  # stands in for a field past the real 64 MiB limit
    try:
        reader = open_manifest(str(p), 0)
        batch = reader.read_batch()
        reader.close()
    finally:
        csv.field_size_limit(previous)
    assert batch is not None
    items, rejects = Validator().validate(batch)
    assert [i[0] for i in items] == ["a", "b"]
    ((_, reject),) = rejects
    assert reject.line == 3 and reject.stage == "client"
    assert reject.reason.startswith("not a valid CSV row: field larger than field limit")


def test_a_truncated_or_corrupt_gzip_is_an_error_never_a_short_manifest(tmp_path: Path) -> None:
    """A gzip manifest cut short (a copy that stopped, a full disk) ended the manifest quietly
    after the rows it held: the run was complete with rows missing. Now it is an error."""
    rows = "\n".join(["id,url"] + [f"b{i},https://img.example/b{i}.jpg" for i in range(60_000)])
    packed = gzip.compress(rows.encode())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    reader = open_manifest(str(cut), 0)
    with pytest.raises(ManifestError, match="truncated gzip"):
        list(iter_rows_sync(reader))
    reader.close()
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(packed[:200] + bytes(64) + packed[264:])
    with pytest.raises(ManifestError, match="not valid gzip"):
        reader = open_manifest(str(bad), 0)
        try:
            list(iter_rows_sync(reader))
        finally:
            reader.close()


@pytest.mark.parametrize("read_size", [1 << 20, 64])
@pytest.mark.parametrize("kind", ["csv", "jsonl", "urls"])
def test_a_row_that_is_not_utf8_is_one_reject_never_a_changed_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int, kind: str
) -> None:
    """A manifest exported as Latin-1 in places: each row whose id or URL holds a byte that
    is not UTF-8 is one reject saying so (a replacement character would change the id
    silently, and make ``caf\xe9`` and ``caf\xe8`` one id), wherever it sits (the first row,
    the first read or later); its id is kept when only its URL holds the byte. A byte in
    another field becomes U+FFFD and the row is tagged."""
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    rows = [("caf\xe9", "x/1", "acme")] + [(f"ok{i}", f"x/ok{i}", "acme") for i in range(10)]
    rows += [("caf\xe8", "x/2", "acme"), ("ok10", "x/\xe9t\xe9", "acme")]
    rows += [("ok11", "x/ok11", "Herm\xe8s")] + [(f"ok{i}", f"x/ok{i}", "b") for i in range(12, 20)]

    def line(ident: str, path: str, brand: str) -> bytes:
        url = f"https://{path}.jpg"
        if kind == "csv":
            return f"{ident},{url},{brand}\n".encode("latin-1")
        if kind == "jsonl":
            obj = {"id": ident, "url": url, "brand": brand}
            return (json.dumps(obj, ensure_ascii=False) + "\n").encode("latin-1")
        return f"{url}\n".encode("latin-1")

    head = b"id,url,brand\n" if kind == "csv" else b""
    p = tmp_path / f"m.{kind}"
    p.write_bytes(head + b"".join(line(*r) for r in rows))
    reader = open_manifest(str(p), 0)
    items, rejects = [], []
    while (batch := reader.read_batch()) is not None:
        i, r = Validator().validate(batch)
        items += i
        rejects += r
    reader.close()
    offset = 2 if kind == "csv" else 1
    if kind == "urls":
        bad = {12}  # a URL list has no other field: only x/\xe9t\xe9 holds a stray byte
        assert [r.id for _, r in rejects] == [None]
    else:
        bad = {0, 11, 12}
        assert [r.id for _, r in rejects] == [None, None, "ok10"]
        brands = {i[0]: i[2].context.brand for i in items}
        assert brands["ok11"] == "Herm\ufffds"
    assert [r.line for _, r in rejects] == [n + offset for n in sorted(bad)]
    assert len(items) == len(rows) - len(bad)
    for _, reject in rejects:
        assert "not UTF-8 text" in reject.reason and reject.stage == "client"
    if kind == "csv":
        assert [r.reason[:34] for _, r in rejects] == [
            "not UTF-8 text (byte 0xE9 in the i",
            "not UTF-8 text (byte 0xE8 in the i",
            "not UTF-8 text (byte 0xE9 in the u",
        ]


def test_a_csv_whose_header_is_not_utf8_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_bytes("id,url,r\xe9f\nok,https://x/1.jpg,a\n".encode("latin-1"))
    with pytest.raises(ManifestError, match="its first line is not UTF-8"):
        open_manifest(str(p), 0)


def test_a_stray_byte_in_the_column_or_key_the_validator_reads_is_found(tmp_path: Path) -> None:
    """The id and URL checked for stray bytes are the ones the validator reads: the URL
    column wherever it stands (a repeated column is refused: see above), and a JSONL
    ``context.id`` when ``id`` is null."""
    csv_path = tmp_path / "m.csv"
    csv_path.write_bytes("brand,id,x,url\nb,a,1,https://x/\xe9\n".encode("latin-1"))
    jsonl_path = tmp_path / "m.jsonl"
    jsonl_path.write_bytes(
        '{"id": null, "context": {"id": "caf\xe9"}, "url": "https://x/2"}\n'.encode("latin-1")
    )
    for path in (csv_path, jsonl_path):
        reader = open_manifest(str(path), 0)
        batch = reader.read_batch()
        reader.close()
        assert batch is not None
        items, rejects = Validator().validate(batch)
        assert items == [] and len(rejects) == 1
        assert "not UTF-8 text" in rejects[0][1].reason


def test_a_manifest_rewritten_in_place_while_read_is_an_error_not_its_end(
    tmp_path: Path,
) -> None:
    """``cp`` or ``export > m.csv`` onto the manifest being read truncates it first: a reader
    that met that shorter file's end took it for the manifest's end, and the rows after were
    never tagged (a run reported complete). The end of input checks the file is the one
    opened, as long as it was then."""
    path = tmp_path / "m.csv"
    lines = ["id,url"] + [f"p{i},https://img.example/{i}.jpg" for i in range(60_000)]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    reader = ManifestReader(str(path), 0, max_rows=1000)
    reader.open()
    assert reader.read_batch() is not None
    with path.open("wb") as fh:  # O_TRUNC, then only part of it written back so far
        fh.write(data[: len(data) // 3])
    with pytest.raises(ManifestError, match="changed while it was read"):
        while reader.read_batch() is not None:
            pass
    reader.close()


def test_a_manifest_read_whole_passes_the_end_check(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_bytes(b"id,url\np1,https://img.example/1.jpg")  # no newline at the end
    reader = ManifestReader(str(path), 0)
    reader.open()
    rows = []
    while (batch := reader.read_batch()) is not None:
        rows += list(batch.rows)
    reader.close()
    assert len(rows) == 1


def test_the_end_check_takes_a_touched_file_and_stdin_read_from_its_middle(
    tmp_path: Path,
) -> None:
    """No false alarm: a ``touch`` (or a backup tool) changes the mtime, not the rows; and
    stdin redirected from a file another command read the first line of starts mid-file."""
    path = tmp_path / "m.csv"
    path.write_bytes(b"id,url\np1,https://img.example/1.jpg\n")
    reader = ManifestReader(str(path), 0)
    reader.open()
    os.utime(path, ns=(1, 1))
    while reader.read_batch() is not None:
        pass
    reader.close()
    path.write_bytes(b"skip me\nid,url\np1,https://img.example/1.jpg\n")
    script = (
        "import os, sys\n"
        "os.read(0, 8)  # 'skip me' and its newline, as a shell's read builtin leaves it\n"
        "from fashiontag_pipeline.engine.source import ManifestReader\n"
        "r = ManifestReader('-', 0)\n"
        "r.open()\n"
        "n = 0\n"
        "while (b := r.read_batch()) is not None:\n"
        "    n += len(b.rows)\n"
        "print(n)\n"
    )
    with path.open("rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-c", script], stdin=stdin, capture_output=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "1"
