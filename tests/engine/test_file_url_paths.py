"""``file:`` URLs whose percent escapes make a path no file can have (found by a hunt)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._images import ImageFileError, read_image_file
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args
from .test_single_mode import red_picture, write_csv_rows


async def test_a_file_url_escaping_a_nul_is_a_reject_not_a_crash(tmp_path: Path) -> None:
    """``file:///img/a%00b.png`` (a NUL written as a percent escape: a cell the client's NUL
    check did not see) crashed ``run`` with a traceback (``ValueError: embedded null byte``),
    exit 1; the row was written ahead, so every resume crashed on it again: the run could
    never complete. It is a ``client`` reject saying why; the other rows are tagged."""
    png = red_picture(tmp_path / "red.png")
    rows = [("nul", "file:///img/a%00b.png"), ("ok", str(png)), ("ok2", png.as_uri())]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            [*run_args(svc.url, out, str(manifest))], check=False, env=ENV
        )
    assert result.returncode == 0, result.stderr
    assert b"Traceback" not in result.stderr
    o = assert_exactly_once(out, out.with_suffix(".rej"), {i for i, _ in rows})
    (reject,) = o.rejects
    assert reject["id"] == "nul" and reject["stage"] == "client"
    assert "NUL" in reject["reason"], reject
    assert {r["taggingResult"]["status"] for r in o.results} == {"success"}


def test_a_path_holding_a_nul_read_again_on_a_resume_is_refused_saying_why() -> None:
    """A row written ahead by a build that crashed on it is read again on the resume: the
    read refuses the path (an :class:`ImageFileError`, the row's reject), no crash."""
    with pytest.raises(ImageFileError, match="NUL"):
        read_image_file("/img/a\x00b.png", 1000)


async def test_fashiontag_tag_of_a_file_url_escaping_a_nul_is_one_clear_line() -> None:
    """``fashiontag tag file:///img/a%00b.png`` printed a traceback."""
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "fashiontag_pipeline",
                "tag",
                "file:///img/a%00b.png",
                "--base-url",
                svc.url,
            ],
            check=False,
            env=ENV,
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fashiontag: cannot read image"), lines
    assert "NUL" in lines[0]
    assert result.stdout == b""
