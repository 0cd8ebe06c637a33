"""Manifests piped on stdin as a pipe delivers them: a producer killed mid-stream, a gzip
stream cut or padded, and the resume that follows (``fashiontag run - --resume``)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args


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
        args = run_args(svc.url, out, "-")
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
