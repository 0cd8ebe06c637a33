"""An image URL's scheme is case-insensitive (RFC 3986): ``HTTPS://`` is an https URL."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args

URLS = ["HTTPS://img.example/a.jpg", "Http://img.example/b.jpg", "https://img.example/c.jpg"]


def _manifest(tmp_path: Path, kind: str) -> tuple[Path, set[str]]:
    if kind == "csv":
        path = tmp_path / "m.csv"
        path.write_text("id,url\n" + "".join(f"r{i},{u}\n" for i, u in enumerate(URLS)))
        return path, {f"r{i}" for i in range(len(URLS))}
    if kind == "jsonl":
        path = tmp_path / "m.jsonl"
        path.write_text(
            "".join(json.dumps({"id": f"r{i}", "url": u}) + "\n" for i, u in enumerate(URLS))
        )
        return path, {f"r{i}" for i in range(len(URLS))}
    path = tmp_path / "m.txt"  # a plain URL list (its first line upper-case too)
    path.write_text("".join(f"{u}\n" for u in URLS))
    return path, set(URLS)


@pytest.mark.parametrize("kind", ["csv", "jsonl", "urls"])
async def test_an_upper_case_scheme_is_tagged_not_rejected(tmp_path: Path, kind: str) -> None:
    manifest, ids = _manifest(tmp_path, kind)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
    err = result.stderr.decode()
    assert result.returncode == 0, err[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids)
    assert o.rejects == []
    assert all(r["taggingResult"]["status"] == "success" for r in o.results), o.results


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
async def test_a_scheme_relative_url_is_one_reject_saying_so(tmp_path: Path, kind: str) -> None:
    """An image URL without its scheme (``//cdn.shop.example/x.jpg``, as a storefront theme
    writes it, meant to take the page's) was taken for a local path and rejected as ``local
    file not found: //cdn.shop.example/x.jpg``, which says nothing of what to fix. It is one
    reject saying the URL lacks its scheme; the other rows are tagged."""
    rows = [("a", "https://img.example/a.jpg"), ("b", "//cdn.shop.example/files/b.jpg")]
    rows.append(("c", "https://img.example/c.jpg"))
    path = tmp_path / f"m.{kind}"
    if kind == "csv":
        path.write_text("id,url\n" + "".join(f"{i},{u}\n" for i, u in rows))
    else:
        path.write_text("".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows))
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(run_args(svc.url, out, str(path)), check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), {"a", "b", "c"})
    assert [(r["id"], r["line"], r["reason"]) for r in o.rejects] == [
        ("b", 3 if kind == "csv" else 2, SCHEME_RELATIVE)
    ]


SCHEME_RELATIVE = (
    "url has no scheme (//host/...: a scheme-relative URL): write it with its scheme,"
    " https://host/..."
)


async def test_a_url_holding_a_space_is_a_reject_saying_so(tmp_path: Path) -> None:
    """An image URL with a space in its file name (``Blue Shirt.jpg``: a DAM's export, which a
    browser opens) was rejected as ``url is not a valid http(s) URL``, the reason a URL without
    a host gets: nothing said what is wrong with it. The reason names the whitespace and how to
    write a space in a URL."""
    path = tmp_path / "m.csv"
    path.write_text(
        "id,url\na,https://img.example/Blue Shirt.jpg\nb,https:///x.jpg\nc,https://img.example/c.jpg\n"
    )
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(run_args(svc.url, out, str(path)), check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), {"a", "b", "c"})
    assert [(r["id"], r["reason"]) for r in o.rejects] == [
        ("a", "url holds whitespace (a space: write it as %20 in a URL)"),
        ("b", "url is not a valid http(s) URL"),
    ]
