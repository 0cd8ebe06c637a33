"""Image URLs exported without their scheme (``www.shop.example/img/1.jpg``,
``cdn.shop.example/2.jpg``: a CMS or a spreadsheet that drops ``https://``), the first hour of
a data team's run: such a value is no http(s) URL, so it is read as a local path, and the row
is a reject; the reason must say what to write, not only that no such file exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
from PIL import Image as PILImage

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args


async def test_a_url_without_its_scheme_is_a_reject_saying_to_write_it(tmp_path: Path) -> None:
    """Every row of such a catalogue was rejected ``local file not found:
    /the/cwd/www.shop.example/img/1.jpg`` and the run exited 0: nothing said the values were
    taken for paths, nor that ``https://`` was missing. A missing path whose first part is a
    host name now says so; a missing local path (``images/3.jpg``) keeps its reason alone."""
    rows = {
        "a": "www.shop.example/img/1.jpg",
        "b": "cdn.shop.example:8443/2.jpg",
        "c": "images/3.jpg",
        "d": "https://img.example/4.jpg",
    }
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\n" + "".join(f"{i},{u}\n" for i, u in rows.items()))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV, cwd=tmp_path
        )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), set(rows))
    reasons = {r["id"]: r["reason"] for r in o.rejects}
    assert set(reasons) == {"a", "b", "c"}
    assert "https://www.shop.example/img/1.jpg" in reasons["a"], reasons["a"]
    assert "https://cdn.shop.example:8443/2.jpg" in reasons["b"], reasons["b"]
    assert reasons["c"] == f"local file not found: {tmp_path / 'images/3.jpg'}"


def test_tag_of_a_url_without_its_scheme_says_to_write_it(tmp_path: Path) -> None:
    """``fashiontag tag www.shop.example/img/1.jpg``: exit 2 saying the scheme is missing."""
    result = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "tag", "www.shop.example/img/1.jpg"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "https://www.shop.example/img/1.jpg" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_a_url_with_its_scheme_mistyped_is_a_reject_saying_what_is_wrong(
    tmp_path: Path,
) -> None:
    """A scheme typed with one slash (``http:/host/...``) was refused as ``url must be an
    http:// or https:// URL ... (scheme 'http' is not supported)``, a reason that contradicts
    itself; one without its colon (``https//host/...``) as ``local file not found:
    /the/cwd/https//host/...``; a URL with a space after it inside quotes (an export's padded
    cell) was told to write the space as ``%20``, which names another image. Each reason now
    says what is wrong with the URL as written."""
    rows = {
        "a": "http:/img.example/a.jpg",
        "b": "HTTPS:img.example/b.jpg",
        "c": "https//img.example/c.jpg",
        "d": '"https://img.example/d.jpg "',
        "e": "https://img.example/e.jpg",
    }
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\n" + "".join(f"{i},{u}\n" for i, u in rows.items()))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV, cwd=tmp_path
        )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), set(rows))
    reasons = {r["id"]: r["reason"] for r in o.rejects}
    assert set(reasons) == {"a", "b", "c", "d"}
    for ident in ("a", "b", "c"):
        assert "not supported" not in reasons[ident], reasons[ident]
        assert "local file" not in reasons[ident], reasons[ident]
        assert "scheme is mistyped" in reasons[ident] and "https://" in reasons[ident]
    assert reasons["d"] == "url has spaces around it (an http(s) URL holds none)"


async def test_tag_refuses_an_image_run_rejects_with_run_s_reason(tmp_path: Path) -> None:
    """``fashiontag tag`` read its argument by rules of its own: ``http://`` (no host) and a
    URL holding a space were sent and printed as a tagging result, exit 0, where ``run``
    rejects the same value; ``s3://bucket/k.jpg``, a mistyped ``http:/host/x.jpg``, a padded
    `` https://...`` or ``C:\\img\\a.jpg`` was ``local file not found: s3://...``, as if the
    value were taken for a path. Each is now exit 2 with one line giving ``run``'s reason,
    nothing sent."""
    values = {
        "no-host": "http://",
        "space": "https://img.example/Blue Shirt.jpg",
        "s3": "s3://bucket/look.jpg",
        "ftp": "ftp://img.example/look.jpg",
        "mistyped": "http:/img.example/look.jpg",
        "padded": " https://img.example/look.jpg",
        "windows": "C:\\img\\look.jpg",
        "bad-data": "data:image/png,abc",
    }
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in values.items()))
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr.decode()[-600:]
        o = assert_exactly_once(out, out.with_suffix(".rej"), set(values))
        reasons = {r["id"]: r["reason"] for r in o.rejects}
        assert set(reasons) == set(values), o.results
        for ident, value in values.items():
            tagged = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", "tag", value, "--base-url", svc.url],
                check=False,
                env=ENV,
                cwd=tmp_path,
            )
            err = tagged.stderr.decode()
            assert tagged.returncode == 2 and not tagged.stdout, (ident, tagged.stdout[:200], err)
            assert len(err.strip().splitlines()) == 1 and reasons[ident] in err, (ident, err)


def test_tag_of_a_relative_path_from_a_removed_folder_says_it_is_not_found(tmp_path: Path) -> None:
    """``tag x.png`` run from a folder removed meanwhile (a shell left in a cleaned-up build
    folder): the path is read as given, ``local file not found: x.png``, exit 2, with no
    ``FileNotFoundError`` traceback from asking for the current folder."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {sys.executable} -m fashiontag_pipeline tag x.png"
    result = subprocess.run(
        ["sh", "-c", script], env=ENV, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == "fashiontag: cannot read image: local file not found: x.png"


async def test_tag_reads_a_file_that_exists_whatever_its_name(tmp_path: Path) -> None:
    """``tag IMAGE_PATH_OR_URL`` (DESIGN 4.1) of a file that is there, named ``C:\\img\\a.png``
    (a Windows-style name a copy from a share leaves on Linux), ``IMG:001.png`` (a camera's),
    ``s3:look.png`` or ``cdn.example.com:8443``, tab-completed by the shell: each was tagged
    until ``tag`` took ``run``'s rules for a manifest's URL cell, then exit 2, ``url is a
    Windows path ..., no path on this machine`` or ``scheme 'IMG' is not supported``, though
    the path names a file on this machine. A file that exists is read; one that does not
    keeps ``run``'s reason (above)."""
    picture = tmp_path / "look.png"
    PILImage.new("RGB", (60, 80), (200, 20, 30)).save(picture)
    names = ["C:\\img\\a.png", "IMG:001.png", "s3:look.png", "cdn.example.com:8443", "http:x.png"]
    for name in names:
        (tmp_path / name).write_bytes(picture.read_bytes())
    async with running_service(ServiceConfig()) as svc:
        for name in names:
            tagged = await anyio.run_process(
                [sys.executable, "-m", "fashiontag_pipeline", "tag", name, "--base-url", svc.url],
                check=False,
                env=ENV,
                cwd=tmp_path,
            )
            err = tagged.stderr.decode()
            assert tagged.returncode == 0 and not err, (name, err)
            assert json.loads(tagged.stdout)["status"] == "success", name
