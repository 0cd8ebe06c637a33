"""Manifests made from a shop's product export (Shopify, Magento, a PIM), whose image column
holds what such exports put there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args
from .strict import StrictFront

#: An image cell of several images (a product's gallery in one column), and URLs that hold
#: another URL the way image proxies and CDNs write them (one image each).
ROWS = [
    ("pipe", "https://img.example/1.jpg|https://img.example/2.jpg"),
    ("comma", "https://img.example/1.jpg,https://img.example/2.jpg"),
    ("semicolon", "https://img.example/1.jpg;http://img.example/2.jpg"),
    ("array", '["https://img.example/1.jpg", "https://img.example/2.jpg"]'),
    (
        "fetch",
        "https://res.cloudinary.example/demo/image/fetch/w_300,h_300/https://img.example/3.jpg",
    ),
    ("proxied", "https://shop.imgix.example/https://img.example/4.jpg?w=300"),
    ("query", "https://cdn.example/resize?src=https%3A%2F%2Fimg.example%2F5.jpg&w=300"),
    ("plain", "https://img.example/6.jpg"),
]
SEVERAL = "url holds several URLs ({}): give each image a row of its own"
REASONS = {
    "pipe": SEVERAL.format("separated by '|'"),
    "comma": SEVERAL.format("separated by ','"),
    "semicolon": SEVERAL.format("separated by ';'"),
    "array": SEVERAL.format("a JSON array"),
}


def _manifest(tmp_path: Path, kind: str) -> Path:
    if kind == "jsonl":
        path = tmp_path / "products.jsonl"
        path.write_text("".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in ROWS))
        return path
    path = tmp_path / "products.csv"
    brand = ",brand" if kind == "csv+brand" else ""
    lines = [f"id,url{brand}"]
    for ident, url in ROWS:
        cell = f'"{url.replace(chr(34), chr(34) * 2)}"' if ("," in url or '"' in url) else url
        lines.append(f"{ident},{cell}{',acme' if brand else ''}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind", ["csv", "csv+brand", "jsonl"])
async def test_an_image_cell_of_several_urls_is_a_reject_saying_so(
    tmp_path: Path, kind: str
) -> None:
    """A product export's gallery column (``images``: ``url1|url2``, a JSON array, Magento's
    comma-separated ``additional_images``) given as the url: the two URLs were sent to the
    service as one (billed, an image no host serves), or a JSON array was rejected as
    ``local file not found: /cwd/["https://...``. Each is a reject saying the cell holds
    several URLs; a URL that holds another the way image proxies write it is sent as it is."""
    manifest = _manifest(tmp_path, kind)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc, StrictFront(svc.url).running() as front:
        args = run_args(front.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), {i for i, _ in ROWS})
    assert {r["id"]: r["reason"] for r in o.rejects} == REASONS
    sent = {
        r["context"]["id"]: r["image"]["content"]
        for _, _, body in front.bodies
        for r in body.get("taggingRequest", [])
    }
    assert sent == {i: u for i, u in ROWS if i not in REASONS}


#: A Shopify product export (its columns as Shopify names them, one image a row; a variant's
#: row with no image), and a PIM export naming its image column ``image_src``.
SHOPIFY = (
    "Handle,Title,Body (HTML),Vendor,Variant SKU,Image Src,Image Position,Variant Image\n"
    'shirt,Shirt,"<p>Soft</p>\n<p><img src=""https://cdn.shop.example/x.gif""></p>",acme,S1,'
    "https://cdn.shopify.example/s/files/1/a.jpg?v=1,1,\n"
    "shirt,,,,S2,https://cdn.shopify.example/s/files/1/b.jpg?v=1,2,\n"
)
PIM = "sku,name,image_src\nS1,Shirt,https://img.example/1.jpg\n"


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (SHOPIFY, "missing column: id, url; the column Image Src holds URLs: name it url"),
        (PIM, "missing column: id, url; the column image_src holds URLs: name it url"),
        ("id,images\n1,https://img.example/1.jpg\n", "the column images holds URLs"),
    ],
)
async def test_a_product_export_without_a_url_column_names_the_column_of_urls(
    tmp_path: Path, text: str, hint: str
) -> None:
    """A product export given as it is (Shopify's ``Image Src``, a PIM's ``image_src``) was
    refused as ``missing column: id, url``, which does not say that the URLs are there under
    another name. The message names the column holding URLs and says to name it ``url``;
    nothing is sent."""
    manifest = tmp_path / "products_export_1.csv"
    manifest.write_text(text)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc, StrictFront(svc.url).running() as front:
        args = run_args(front.url, out, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    err = result.stderr.decode()
    assert result.returncode == 1, err[-600:]
    assert hint in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not [b for b in front.bodies if b[0] in ("POST", "PUT")]


@pytest.mark.parametrize("header", [True, False])
async def test_the_fix_said_for_a_semicolon_csv_gives_a_manifest(
    tmp_path: Path, header: bool
) -> None:
    """Excel in a region whose numbers take a decimal comma (Germany, France, ...) writes
    ``;`` between the cells of a "CSV UTF-8 (Comma delimited)" file. Refused, such a file was
    told to be saved "as CSV UTF-8 (comma delimited)": what it already was, so the same
    export gave the same file and the same error. The message says why Excel wrote
    semicolons and gives a command that converts the file; that command, run as given, makes
    a manifest whose rows are tagged, their ids as they were."""
    rows = '00123;https://img.example/1.jpg;"Dolce; Gabbana"\r\n0042;https://img.example/2.jpg;\r\n'
    manifest = tmp_path / "Katalog.csv"
    manifest.write_bytes(b"\xef\xbb\xbf" + (("id;url;brand\r\n" if header else "") + rows).encode())
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
        err = result.stderr.decode()
        assert result.returncode == 1, err
        assert "region" in err, err
        command = err.split("; convert it, ", 1)[1].split(" < ", 1)[0]
        converted = tmp_path / "Katalog-commas.csv"
        with manifest.open("rb") as src, converted.open("wb") as dst:
            subprocess.run(command, shell=True, stdin=src, stdout=dst, check=True)
        if not header:
            converted.write_bytes(b"id,url,brand\n" + converted.read_bytes())
        args = run_args(svc.url, out, str(converted))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    o = assert_exactly_once(out, out.with_suffix(".rej"), {"00123", "0042"})
    assert o.rejects == []


#: Gallery cells as exports space them (WooCommerce's Images column: ``url1, url2``), and the
#: image list of a JSON export (a JSONL url that is an array).
SPACED = [
    ("comma-space", "https://img.example/1.jpg, https://img.example/2.jpg", "','"),
    ("pipe-spaced", "https://img.example/1.jpg | https://img.example/2.jpg", "'|'"),
    ("spaces", "https://img.example/1.jpg https://img.example/2.jpg", "' '"),
]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
async def test_a_gallery_cell_spaced_as_exports_write_it_is_a_reject_saying_so(
    tmp_path: Path, kind: str
) -> None:
    """WooCommerce's export writes a product's images as ``url1, url2``: such a cell was a
    reject telling the user to write the space as %20, which made ``url1,%20https://...``,
    sent to the service (billed) as one URL. It is a reject saying the cell holds several URLs,
    as ``url1,url2`` is; the same for a JSONL url that is an array of URLs (``url is
    missing``, before)."""
    rows = [(i, u) for i, u, _ in SPACED] + [("plain", "https://img.example/6.jpg")]
    if kind == "jsonl":
        manifest = tmp_path / "products.jsonl"
        listed = {"id": "list", "url": ["https://img.example/1.jpg", "https://img.example/2.jpg"]}
        manifest.write_text(
            "".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows)
            + json.dumps(listed)
            + "\n"
        )
    else:
        manifest = tmp_path / "products.csv"
        manifest.write_text("id,url\n" + "".join(f'{i},"{u}"\n' for i, u in rows))
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
    assert result.returncode == 0, result.stderr.decode()[-600:]
    ids = {i for i, _ in rows} | ({"list"} if kind == "jsonl" else set())
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids)
    expected = {i: SEVERAL.format(f"separated by {sep}") for i, _, sep in SPACED}
    if kind == "jsonl":
        expected["list"] = SEVERAL.format("a JSON array")
    assert {r["id"]: r["reason"] for r in o.rejects} == expected
