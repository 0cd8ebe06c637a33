"""Manifests piped on stdin as a pipe delivers them: a producer killed mid-stream, a gzip
stream cut or padded, and the resume that follows (``fashiontag run - --resume``)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import ManifestError
from fashiontag_pipeline.engine import manifest_bytes
from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, short_deadline


def _dump(n: int) -> bytes:
    """A CSV dump of ``n`` rows whose URLs do not compress away (a gzip cut lands mid-rows)."""
    rnd = random.Random(7)
    rows = "".join(f"s{i},https://img.example/{rnd.getrandbits(64):x}.jpg\n" for i in range(n))
    return ("id,url\n" + rows).encode()


async def test_a_gzip_stream_cut_short_tells_how_to_resume_it_without_billing_twice(
    tmp_path: Path,
) -> None:
    """``aws s3 cp s3://.../dump.csv.gz - | fashiontag run -`` with the download cut: exit 1,
    the rows read kept. The message said to run again with --restart once the file is whole,
    which for stdin sends every row read again (billed twice): the way on is the whole stream
    piped again with --resume, which sends each row once."""
    n = 12_000
    whole = gzip.compress(_dump(n))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        # (Creates on their way when the cut stopped the run are looked for by the resume
        # for the request deadline after they were sent: short here.)
        args = run_args(svc.url, out, "-", *short_deadline(tmp_path))
        head = whole[: len(whole) * 3 // 5]
        cut = await anyio.run_process(args, input=head, check=False, env=ENV)
        message = cut.stderr.decode()
        assert cut.returncode == 1, message
        assert "truncated gzip" in message and "--restart" not in message, message
        assert "--resume" in message, message
        resumed = await anyio.run_process([*args, "--resume"], input=whole, check=False, env=ENV)
        assert resumed.returncode == 0, resumed.stderr.decode()
        billed = svc.store.image_count
    assert billed == n
    assert_exactly_once(out, out.with_suffix(".rej"), {f"s{i}" for i in range(n)})


async def test_a_gzip_stream_padded_with_nul_bytes_is_read_as_zcat_reads_it(
    tmp_path: Path,
) -> None:
    """A gzip dump padded with NUL bytes after its data (written through a block device, ``dd
    conv=sync``; zcat and Python's gzip skip them) was refused as "not valid gzip" (exit 1,
    after its rows were sent; every resume the same). Bytes after the gzip data that are not
    gzip are refused saying so (its rows could be lost), not as "not valid gzip"."""
    n = 300
    member = gzip.compress(_dump(n))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-")
        padded = await anyio.run_process(args, input=member + bytes(700), check=False, env=ENV)
        assert padded.returncode == 0, padded.stderr.decode()
        assert svc.store.image_count == n
        assert_exactly_once(out, out.with_suffix(".rej"), {f"s{i}" for i in range(n)})
        junk = await anyio.run_process(
            [*args, "--restart"], input=member + b"\0\0junk\n", check=False, env=ENV
        )
    message = junk.stderr.decode()
    assert junk.returncode == 1 and "not gzip after the end of its gzip data" in message


@pytest.mark.parametrize("read_size", [1 << 20, 7, 2])
def test_nul_padding_is_skipped_wherever_reads_cut_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    """Padding read in pieces, between members, and a member cut after padding."""
    dump = _dump(40)
    first, second = dump[:200], dump[200:]
    monkeypatch.setattr(manifest_bytes, "READ_SIZE", read_size)
    cases = {
        "padded": gzip.compress(dump) + bytes(33),
        "between members": gzip.compress(first) + bytes(9) + gzip.compress(second) + bytes(3),
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.csv.gz"
        path.write_bytes(data)
        reader = open_manifest(str(path), 0)
        try:
            ids = [fields[0] for _, fields in iter_rows_sync(reader)]
        finally:
            reader.close()
        assert ids == [f"s{i}" for i in range(40)], name
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(first) + bytes(9) + gzip.compress(second)[:-5])
    reader = open_manifest(str(cut), 0)
    try:
        with pytest.raises(ManifestError, match="truncated gzip"):
            list(iter_rows_sync(reader))
    finally:
        reader.close()


async def test_a_plain_stream_that_ends_mid_line_is_said_to(tmp_path: Path) -> None:
    """``head -c 50000 dump.csv | fashiontag run -`` (a producer killed mid-line): its last
    row, cut short (``p1491,https://img.example/14``), was tagged and the run reported complete
    with nothing said, the rows after the cut never seen. Nothing on a pipe tells that from a
    stream whose last line has no line end, so the run goes on as before, and says it: a
    warning names the last line and how to go on if the producer failed. A stream ending
    with a line end says nothing."""
    data = _dump(100)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, "-")
        cut = await anyio.run_process(args, input=data[: len(data) - 9], check=False, env=ENV)
        whole = await anyio.run_process([*args, "--restart"], input=data, check=False, env=ENV)
    said = cut.stderr.decode()
    assert cut.returncode == 0, said
    assert "ended without a line end" in said and "line 101" in said, said
    assert "--resume" in said, said
    assert whole.returncode == 0 and "without a line end" not in whole.stderr.decode()
