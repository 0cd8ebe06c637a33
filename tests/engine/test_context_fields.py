"""Context fields and JSONL rows as catalogues hold them, fed to ``fashiontag run`` (each test
failed before its fix): every field the row gives is sent as the spec takes it, or the row is a
reject saying why and carrying its id; never a field silently dropped or changed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
from PIL import Image

from fashiontag_pipeline._models import Detection
from fashiontag_pipeline.engine.source import open_manifest
from fashiontag_pipeline.engine.validate import Validator
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service._synthesis import scene_of
from fashiontag_pipeline.service.analyzer import content_hash

from .helpers import ENV, Outcomes, read_outcomes, run_args

URL = "https://x.example/{}.jpg"


def _sent(manifest: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """(id -> the context fields each accepted row is sent with, its rejects) of a manifest,
    as the engine's validator makes them."""
    reader = open_manifest(str(manifest), 0)
    sent: dict[str, dict[str, Any]] = {}
    refused: list[dict[str, Any]] = []
    try:
        while (batch := reader.read_batch()) is not None:
            items, singles, rejects = Validator(cwd=str(manifest.parent)).route(batch)
            for ident, _, request in items:
                sent[ident] = _fields(request.context)
            for ident, _, single in singles:
                sent[ident] = _fields(single.context)
            refused += [{"id": r.id, "reason": r.reason, "line": r.line} for _, r in rejects]
    finally:
        reader.close()
    return sent, refused


def _fields(context: Any) -> dict[str, Any]:
    fields = {f: getattr(context, f) for f in context.__struct_fields__}
    return {f: v for f, v in fields.items() if v is not None and f != "id"}


async def _run(manifest: Path, *flags: str) -> tuple[int, str, Outcomes]:
    out = manifest.with_suffix(".out")
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, *flags, str(manifest))
        result = await anyio.run_process(args, check=False, env=ENV)
    return result.returncode, result.stderr.decode(), read_outcomes(out, out.with_suffix(".rej"))


def _jsonl(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


async def test_jsonl_keys_in_another_case_are_read_as_a_csv_header_is(tmp_path: Path) -> None:
    """A JSONL export whose keys are capitalised (``{"ID": ..., "URL": ..., "Brand": ...}``, as
    an ERP writes them) had every row refused as "id is missing" (its id there), and a row
    with ``"Brand"`` or ``"Gender"`` beside ``id`` and ``url`` was sent without them, not a
    word said; a CSV header takes the same names in any case. Two keys naming one field
    (``brand`` and ``Brand``, ``productContentName`` and ``product_content_name``) were one of
    them sent, a guess: the row is a reject naming both."""
    manifest = _jsonl(
        tmp_path / "m.jsonl",
        [
            json.dumps({"ID": "a", "URL": URL.format("a"), "Brand": "acme", "Gender": "F"}),
            json.dumps({"id": "b", "Url": URL.format("b"), "PRICE": "1,299.00", "Age": ["3-5"]}),
            json.dumps({"Id": "c", "url": URL.format("c"), "Detection": ["top"], "SKU": "x"}),
            json.dumps({"id": "d", "url": URL.format("d"), "brand": "a", "Brand": "b"}),
            json.dumps({"id": "e", "url": URL.format("e"), "productContentName": "n"})[:-1]
            + ', "product_content_name": "m"}',
            json.dumps({"id": "f", "url": URL.format("f"), "productcontentname": "Name"}),
        ],
    )
    sent, refused = _sent(manifest)
    assert sent == {
        "a": {"brand": "acme", "gender": "F"},
        "b": {"price": "1,299.00", "age": ["3-5"]},
        "c": {"detection": [Detection.TOP]},
        "f": {"product_content_name": "Name"},
    }
    assert [(r["id"], r["line"]) for r in refused] == [("d", 4), ("e", 5)]
    assert "'brand' and 'Brand'" in refused[0]["reason"]
    assert "'productContentName' and 'product_content_name'" in refused[1]["reason"]
    code, err, o = await _run(manifest)
    assert code == 0, err[-400:]
    assert sorted(o.ids) == ["a", "b", "c", "f"]
    assert sorted(r["id"] for r in o.rejects) == ["d", "e"]


async def test_jsonl_fields_beside_a_context_object_are_sent(tmp_path: Path) -> None:
    """A JSONL row with a ``context`` object (the spec's request shape, or an export's own
    ``"context": {"source": "feed"}``) had every context field beside it dropped without a
    word (``brand`` at the top, ``gender`` in the object: only ``gender`` sent), and a field
    given in both with other values (``"id": "d"``, ``"context": {"id": "e"}``) one of them
    sent, a guess. Both places are read; a field in both with two values is a reject."""
    manifest = _jsonl(
        tmp_path / "m.jsonl",
        [
            json.dumps({"id": "a", "url": URL.format("a"), "brand": "acme", "context": {"x": 1}}),
            json.dumps(
                {"url": URL.format("b"), "price": "12", "context": {"id": "b", "gender": "F"}}
            ),
            json.dumps(
                {"id": "c", "url": URL.format("c"), "brand": "x", "context": {"brand": "y"}}
            ),
            json.dumps({"id": "d", "url": URL.format("d"), "context": {"id": "e"}}),
            json.dumps({"id": "f", "url": URL.format("f"), "age": ["3-5"], "context": {"id": "f"}}),
            json.dumps(
                {"id": "g", "url": URL.format("g"), "Season": "SS24", "context": {"season": "AW"}}
            ),
        ],
    )
    sent, refused = _sent(manifest)
    assert sent == {
        "a": {"brand": "acme"},
        "b": {"price": "12", "gender": "F"},
        "f": {"age": ["3-5"]},
    }
    assert [(r["id"], r["line"]) for r in refused] == [("c", 3), ("d", 4), ("g", 6)]
    assert all("in its context object" in r["reason"] for r in refused), refused
    code, err, o = await _run(manifest)
    assert code == 0, err[-400:]
    assert sorted(o.ids) == ["a", "b", "f"]
    assert sorted(r["id"] for r in o.rejects) == ["c", "d", "g"]


async def test_a_jsonl_id_written_as_a_number_is_its_text(tmp_path: Path) -> None:
    """A JSONL export writing its ids as numbers (``{"id": 123, ...}``: ``row_to_json``) had
    each row a reject; such an id is its decimal text, exactly (a row repeating it as
    ``"123"`` is its duplicate, as in a CSV); a float id is a reject saying why."""
    manifest = _jsonl(
        tmp_path / "m.jsonl",
        [
            '{"id": 123, "url": "https://x.example/1.jpg"}',
            '{"id": "123", "url": "https://x.example/2.jpg"}',
            '{"id": 9007199254740993, "url": "https://x.example/3.jpg"}',
            '{"id": 1.5, "url": "https://x.example/4.jpg"}',
            '{"id": "ok", "url": "https://x.example/5.jpg"}',
        ],
    )
    code, err, o = await _run(manifest)
    assert code == 0, err[-400:]
    assert sorted(o.ids) == ["123", "9007199254740993", "ok"]
    got = {r["line"]: (r["id"], r["reason"]) for r in o.rejects}
    assert got[2] == ("123", f"duplicate id (first seen at {manifest} line 1)")
    assert got[4][0] is None and got[4][1].startswith("id must be a string or an integer, not")
    assert sorted(got) == [2, 4]


def _a_top_alone() -> bytes:
    """A PNG the reference service sees as a top and nothing else: tagged as clothing, and as
    no product when shoes are asked for."""
    for g in range(256):
        buf = io.BytesIO()
        Image.new("RGB", (300, 400), (g, 40, 90)).save(buf, "PNG")
        if scene_of(content_hash(buf.getvalue())) == [Detection.TOP]:
            return buf.getvalue()
    raise AssertionError("no such image")


async def test_a_detection_cell_of_separators_or_spaces_is_no_detection(tmp_path: Path) -> None:
    """A CSV ``detection`` cell holding only a separator or spaces (``|``, `` ``: an export
    joining an empty list) was sent as ``"detection": []`` where an empty cell sends none: in
    single mode the run's ``--detection SHOES`` was not applied to the row, its image tagged
    as clothing (a top) while the same image with an empty cell was tagged for shoes (none).
    Such a cell is no detection, as in JSONL, and the run's default applies."""
    top = tmp_path / "top.png"
    top.write_bytes(_a_top_alone())
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "id,url,detection\n"
        f"empty,{top},\n"
        f"sep,{top},|\n"
        f"space,{top}, \n"
        "bulk,https://x.example/1.jpg, | \n"
    )
    sent, refused = _sent(manifest)
    assert not refused and sent == {"empty": {}, "sep": {}, "space": {}, "bulk": {}}
    code, err, o = await _run(manifest, "--detection", "SHOES")
    assert code == 0, err[-400:]
    kinds = {r["id"]: [x["type"] for x in r["taggingResult"]["data"]["objects"]] for r in o.results}
    assert kinds["empty"] == ["no detected product"]  # the run's SHOES, and no shoes in it
    assert kinds["sep"] == kinds["space"] == kinds["empty"]


def test_an_empty_field_beside_a_context_object_is_no_second_value(tmp_path: Path) -> None:
    """An export that writes every column, an empty one as ``""`` (or ``[]``), beside a
    ``context`` object holding the value (``"brand": "", "context": {"brand": "acme"}``) had
    the row a reject, "given both ... with different values": an empty field is no value
    anywhere else (it sends nothing), so it is none here either; the other place's is sent."""
    manifest = _jsonl(
        tmp_path / "m.jsonl",
        [
            json.dumps({"id": "a", "url": URL.format("a"), "brand": "", "context": {"brand": "x"}}),
            json.dumps(
                {"id": "b", "url": URL.format("b"), "gender": "M", "context": {"gender": ""}}
            ),
            json.dumps({"id": "c", "url": URL.format("c"), "age": [], "context": {"age": ["3-5"]}}),
            json.dumps({"id": "", "url": URL.format("d"), "context": {"id": "d"}}),
        ],
    )
    sent, refused = _sent(manifest)
    assert not refused, refused
    assert sent == {"a": {"brand": "x"}, "b": {"gender": "M"}, "c": {"age": ["3-5"]}, "d": {}}


def test_two_id_keys_are_a_reject_naming_both_not_id_is_missing(tmp_path: Path) -> None:
    """An object whose id is under two keys in other cases (``"ID"`` and ``"Id"``, no ``id``)
    was a reject saying ``id is missing``, its id there twice: it names both keys, as
    two keys naming any other field do."""
    manifest = _jsonl(tmp_path / "m.jsonl", ['{"ID": "a", "Id": "b", "url": "https://x/1.jpg"}'])
    _, refused = _sent(manifest)
    assert [r["reason"] for r in refused] == ["keys 'ID' and 'Id' name the same field: keep one"]
