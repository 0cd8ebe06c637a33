"""Where a manifest's rows must not depend on how its bytes arrive: cuts between chunks, stdin
read in small pieces, a resume that reads the same bytes in other pieces.

Found by a hunt: the source cut chunks at a newline with an even count of quotes before it, and
a quote inside an unquoted field (``Jeans 32" waist``) turned that parity for the rest of the
manifest, so cuts fell inside quoted fields: valid rows became rejects and their tails rows of
ids the manifest never had (sent and tagged), differently for each chunking of the same bytes,
so a stdin ``--resume`` of the same bytes was refused.
"""

from __future__ import annotations

import csv
import io
import random
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import ManifestError
from fashiontag_pipeline.engine import manifest_bytes
from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, read_outcomes, run_args, taken_in

# A bare quote inside an unquoted field is literal for the csv module (``32"``: Jeans 32"
# waist), so the manifest below is one csv.reader can read whole: every row has 3 fields.
STRAY_QUOTE_CSV = (
    b"id,title,url\n"
    b'p1,Jeans 32" waist,https://x/1.jpg\n'
    b'p2,"Summer dress\nlight cotton",https://x/2.jpg\n'
    b"p3,Shirt,https://x/3.jpg\n"
    b'p4,"Coat\nwool",https://x/4.jpg\n'
    b"p5,Hat,https://x/5.jpg\n"
)


def _reference_rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode(), newline="")))[1:]


@pytest.mark.parametrize("read_size", [1 << 20, 64, 40])
def test_a_literal_quote_does_not_move_record_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    """The source cuts chunks at a newline with an even count of quote bytes before it; a
    quote that is literal for the csv module (inside an unquoted field) inverts that parity
    for the rest of the manifest, so later chunks are cut inside a quoted field: a valid row
    is split in two (the row a reject, its tail a row of a phantom id), differently for
    each chunking of the same bytes."""
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    p = tmp_path / "m.csv"
    p.write_bytes(STRAY_QUOTE_CSV)
    reader = open_manifest(str(p), 0)
    try:
        rows = [list(fields) for _, fields in iter_rows_sync(reader)]
    finally:
        reader.close()
    assert rows == _reference_rows(STRAY_QUOTE_CSV)


def _night(n: int) -> bytes:
    rows = ["id,title,url", 'p0,Jeans 32" waist,https://img.example/0.jpg']
    for i in range(1, n):
        title = '"Summer dress\nlight cotton"' if i % 20 == 7 else "Shirt"
        rows.append(f"p{i},{title},https://img.example/{i}.jpg")
    return ("\n".join(rows) + "\n").encode()


async def test_stdin_resume_of_the_same_bytes_is_not_refused_for_how_they_arrived(
    tmp_path: Path,
) -> None:
    """The same bytes piped again with --resume: the first attempt read them in one pipe
    read, the resume in small pieces (a slow producer). The rows must be the same rows at the
    same lines, so the resume goes on and every id has exactly one outcome."""
    n = 300
    data = _night(n)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig(rate=20.0)) as svc:
        args = run_args(svc.url, out, "-", "--state", str(tmp_path / "st"))
        proc = await anyio.open_process(
            args, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
        )
        assert proc.stdin is not None
        await proc.stdin.send(data)
        # Killed once every row is read and taken in (few tagged at 20/s), not a fixed 3 s
        # after its start: on a loaded machine part of them may not be read by then.
        with anyio.fail_after(60):
            while taken_in(tmp_path / "st")[0] < n and proc.returncode is None:
                await anyio.sleep(0.02)
        assert proc.returncode is None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()

        resumed = await anyio.open_process(
            [*args, "--resume"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
        )
        assert resumed.stdin is not None and resumed.stderr is not None
        try:
            for i in range(0, len(data), 64):
                await resumed.stdin.send(data[i : i + 64])
                await anyio.sleep(0.002)
            await resumed.stdin.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the resume stopped reading (refused)
        with anyio.fail_after(120):
            err = b"".join([chunk async for chunk in resumed.stderr])
            code = await resumed.wait()
        await resumed.aclose()
    assert code == 0, err.decode()[-600:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    ids = [r["id"] for r in o.results] + [r["id"] for r in o.rejects]
    assert sorted(ids) == sorted(f"p{i}" for i in range(n)), o.rejects


class _Trickle(io.RawIOBase):
    """stdin from a slow producer: ``read1`` returns the sizes given, in turn."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.pos, self.sizes = data, 0, sizes

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        size = self.sizes.pop(0) if self.sizes else 1 << 20
        out = self.data[self.pos : self.pos + size]
        self.pos += len(out)
        return out

    def fileno(self) -> int:
        raise io.UnsupportedOperation


def test_gzip_on_stdin_is_detected_when_its_first_read_is_one_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gzip is detected from the first two bytes, but only in the first read's bytes: a pipe
    whose first read returns one byte (a rate-limited producer) is taken for text, and a
    good manifest is refused ("neither CSV nor JSONL")."""
    import gzip

    data = gzip.compress(b"id,url\np1,https://x/1.jpg\n")

    class Stdin:
        buffer = _Trickle(data, [1])

    monkeypatch.setattr("sys.stdin", Stdin)
    reader = open_manifest("-", 0)
    try:
        rows = [(line, list(fields)) for line, fields in iter_rows_sync(reader)]
    finally:
        reader.close()
    assert rows == [(2, ["p1", "https://x/1.jpg"])]


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("m.jsonl", b'{"id":"p1","url":"https://x/1"}\r{"id":"p2","url":"https://x/2"}\r'),
        ("u.txt", b"https://x/1\rhttps://x/2\r"),
    ],
)
def test_bare_cr_line_ends_in_a_jsonl_or_url_list_are_a_clear_error(
    tmp_path: Path, name: str, data: bytes
) -> None:
    """(A CSV with bare CR line ends is read row by row, as the csv module reads it.) A JSONL
    or URL list is read a line per row, split at LF: with bare CR line ends every row was one
    line, one reject without an id, and the run ended with exit 0."""
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(ManifestError, match="bare CR"):
        open_manifest(str(p), 0)


def _random_csv(rnd: random.Random, rows: int) -> bytes:
    """Rows of id,title,url with titles that hold what the csv module reads in many ways:
    quoted fields with commas, doubled quotes, LF, CR and CRLF inside; quotes inside unquoted
    fields; text after a closing quote; empty fields."""
    titles = [
        "Shirt",
        'Jeans 32" waist',
        '"Summer dress\nlight cotton"',
        '"Coat, wool"',
        '"He said ""hi"""',
        '"a\r\nb"',
        '"x\ry"',
        '"closed"after',
        "",
        "5'11\" tall",
        '"""quoted"" start"',
    ]
    ends = ["\n", "\r\n"]
    out = ["id,title,url" + rnd.choice(ends)]
    for i in range(rows):
        out.append(f"p{i},{rnd.choice(titles)},https://x/{i}.jpg{rnd.choice(ends)}")
    return "".join(out).encode()


@pytest.mark.parametrize("seed", range(40))
def test_rows_and_lines_do_not_depend_on_where_the_input_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rnd = random.Random(seed)
    data = _random_csv(rnd, rnd.randint(1, 60))
    want = _reference_rows(data)
    p = tmp_path / "m.csv"
    p.write_bytes(data)
    seen: list[list[tuple[int, list[str]]]] = []
    for size in (1 << 20, rnd.randint(2, 8), rnd.randint(9, 64), rnd.randint(65, 300)):
        monkeypatch.setattr(manifest_bytes, "READ_SIZE", size)
        reader = open_manifest(str(p), 0, max_rows=rnd.randint(1, 7))
        try:
            rows = [(line, list(fields)) for line, fields in iter_rows_sync(reader)]
        finally:
            reader.close()
        assert [fields for _, fields in rows] == want, size
        seen.append(rows)
    assert all(rows == seen[0] for rows in seen)  # the same lines too
