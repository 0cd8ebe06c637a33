"""Arguments that are no UTF-8 text (a task id or an image URL pasted from a Latin-1 terminal,
a shell variable read from an ISO-8859-1 export): Python holds their bytes as lone surrogates,
which no request can carry."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from PIL import Image as PILImage

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV


async def _fashiontag(*args: str | bytes) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", *args], check=False, env=ENV
    )
    return result.returncode, result.stderr.decode("utf-8", "replace")


async def test_a_task_id_or_image_url_not_utf8_is_exit_2_saying_so(tmp_path: Path) -> None:
    """``tasks status``/``tasks results`` of such a task id and ``tag`` of such a URL ended in a
    ``UnicodeEncodeError`` traceback, exit 1. Each is now exit 2 naming the byte (``tag``:
    one line), nothing sent; a local file whose name holds such a byte is still read (a path)."""
    async with running_service(ServiceConfig()) as svc:
        for command in (
            [b"tasks", b"status", b"\xff"],
            [b"tasks", b"results", b"ab\xffc"],
            [b"tag", b"https://img.example/\xe9t\xe9.jpg"],
        ):
            code, err = await _fashiontag(*command, "--base-url", svc.url)
            assert code == 2 and "Traceback" not in err, (command, err)
            assert "not UTF-8" in err and ("0xFF" in err or "0xE9" in err), (command, err)
            assert command[0] != b"tag" or len(err.splitlines()) == 1, err
        picture = tmp_path / "look.png"
        PILImage.new("RGB", (60, 80), (200, 20, 30)).save(picture)
        odd = bytes(tmp_path) + b"/caf\xe9.png"
        Path(odd.decode("utf-8", "surrogateescape")).write_bytes(picture.read_bytes())
        code, err = await _fashiontag(b"tag", odd, "--base-url", svc.url)
        assert code == 0, err
