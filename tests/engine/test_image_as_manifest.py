"""An image given where a manifest is expected (``fashiontag run photo.jpg``): refused saying
it is an image, and which command tags one (it failed before its fix)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import anyio
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, run_args


def _picture(fmt: str) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (32, 24), (200, 20, 30)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("name", "fmt", "what"),
    [
        ("photo.jpg", "JPEG", "a JPEG image"),
        ("photo.png", "PNG", "a PNG image"),
        ("photo.webp", "WEBP", "a WebP image"),
        ("photo.gif", "GIF", "a GIF image"),
        ("photo.jpg.gz", "JPEG", "a JPEG image"),
    ],
)
async def test_an_image_given_as_a_manifest_says_so_and_points_to_tag(
    tmp_path: Path, name: str, fmt: str, what: str
) -> None:
    """``fashiontag run photo.jpg`` said "neither CSV nor JSONL (its first line is not UTF-8
    text)": nothing about the file being an image, nor that ``fashiontag tag`` tags one."""
    data = _picture(fmt)
    manifest = tmp_path / name
    manifest.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
        assert not svc.store.tasks
    err = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in err, err[-400:]
    assert f"manifest {manifest} is {what}, not a manifest" in err, err
    assert "fashiontag tag" in err and len(err.strip().splitlines()) == 1, err
