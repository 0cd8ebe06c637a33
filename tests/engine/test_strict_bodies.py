"""The requests ``fashiontag run`` sends, checked as a service that takes nothing beyond the
spec would check them (:mod:`.strict`, in front of the reference service, which is lenient in
places): a catalogue's odd values in every field, each sent in the spec's shape (each test
failed before its fix)."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import anyio
from PIL import Image

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, Outcomes, read_outcomes, run_args
from .strict import StrictFront


async def _run(
    manifests: list[Path], *flags: str, refuse: bool = False
) -> tuple[int, str, Outcomes, StrictFront]:
    out = manifests[0].with_suffix(".out")
    async with running_service(ServiceConfig(fetch=False)) as svc:
        front = StrictFront(svc.url, refuse=refuse)
        async with front.running():
            args = run_args(front.url, out, *flags, *map(str, manifests))
            result = await anyio.run_process(args, check=False, env=ENV)
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    return result.returncode, result.stderr.decode(), outcomes, front


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 96), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_a_data_uri_with_media_type_parameters_is_sent_with_the_spec_prefix(
    tmp_path: Path,
) -> None:
    """A ``data:`` URI with a parameter before ``;base64`` (RFC 2397 allows them: a tool that
    names the file, ``data:image/png;name=front.png;base64,...``) was sent as written, and a
    service holding to the spec's ``data:image/<image_ext>;base64,`` prefix refuses it (801,
    "base64 content without its prefix": a reject the user cannot make sense of, the URI being
    a good one). It is now sent as ``data:image/png;base64,...``, and tagged."""
    payload = base64.b64encode(_png()).decode()
    manifest = _jsonl(
        tmp_path / "m.jsonl",
        [
            {"id": "n", "url": f"data:image/png;name=front.png;base64,{payload}"},
            {"id": "c", "url": f"data:image/png;charset=binary;base64,{payload}"},
            {"id": "p", "url": f"data:image/png;base64,{payload}"},
        ],
    )
    code, err, outcomes, front = await _run([manifest], refuse=True)
    assert code == 0, err
    assert not outcomes.rejects, outcomes.rejects
    assert not front.violations, front.violations
    assert sorted(outcomes.ids) == ["c", "n", "p"]
    sent = [b["image"]["content"] for _, _, b in front.bodies]
    assert sent == [f"data:image/png;base64,{payload}"] * 3


async def test_tag_sends_a_data_uri_with_parameters_with_the_spec_prefix() -> None:
    """``fashiontag tag`` with such a URI: the same prefix (it printed the 801 failure)."""
    payload = base64.b64encode(_png()).decode()
    async with running_service(ServiceConfig(fetch=False)) as svc:
        front = StrictFront(svc.url, refuse=True)
        async with front.running():
            uri = f"data:image/png;name=front.png;base64,{payload}"
            args = [sys.executable, "-m", "fashiontag_pipeline", "tag", uri]
            result = await anyio.run_process([*args, "--base-url", front.url], check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    assert not front.violations, front.violations
    assert front.bodies[0][2]["image"]["content"] == f"data:image/png;base64,{payload}"


async def test_age_is_read_alike_in_csv_and_jsonl(tmp_path: Path) -> None:
    """``age`` (bulk: an array of strings) from a CSV cell ``20s|30s`` is two values; the same
    text in a JSONL row was sent as one age group, ``["20s|30s"]``, which a service reads as
    no group it knows; a JSONL ``"age": ""`` (an export writing every column) was sent as
    ``[""]``, and a CSV cell of separators as ``[]``, where an empty field sends nothing.
    Each row now sends what the CSV reading gives."""
    jsonl = _jsonl(
        tmp_path / "m.jsonl",
        [
            {"id": "j1", "url": "https://x.example/1.jpg", "age": "20s|30s"},
            {"id": "j2", "url": "https://x.example/2.jpg", "age": ""},
            {"id": "j3", "url": "https://x.example/3.jpg", "age": ["20s", "", " 30s "]},
            {"id": "j4", "url": "https://x.example/4.jpg", "age": [""]},
            {"id": "j5", "url": "https://x.example/5.jpg", "context": {"age": "teen | 20s"}},
        ],
    )
    csv = tmp_path / "m.csv"
    csv.write_text(
        "id,url,age\n"
        "c1,https://x.example/c1.jpg,20s|30s\n"
        "c2,https://x.example/c2.jpg,|\n"
        "c3,https://x.example/c3.jpg, \n"
    )
    code, err, outcomes, front = await _run([jsonl, csv])
    assert code == 0, err
    assert not front.violations, front.violations
    assert len(outcomes.ids) == 8 and not outcomes.rejects
    sent = {
        r["context"]["id"]: r["context"].get("age")
        for _, _, body in front.bodies
        for r in body.get("taggingRequest", [])
    }
    assert sent == {
        "j1": ["20s", "30s"],
        "j2": None,
        "j3": ["20s", "30s"],
        "j4": None,
        "j5": ["teen", "20s"],
        "c1": ["20s", "30s"],
        "c2": None,
        "c3": None,
    }


async def test_a_jsonl_field_holding_half_an_emoji_is_read_as_a_stray_byte_is(
    tmp_path: Path,
) -> None:
    """A JSONL line escaping half of a UTF-16 surrogate pair (``"\\ud83d"``: an exporter in
    Java, .NET or JavaScript that cut a name across an emoji) was a reject saying "not valid
    JSON: Input data was truncated", without its id, whatever field held it. It is now read
    as a stray byte is: U+FFFD in a context field (the row tagged, nothing but UTF-8 sent), a
    reject saying so, with the id when that is clean, when the id or the URL holds it."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"id": "a", "url": "https://x.example/a.jpg", "brand": "Smile \\ud83d"}\n'
        '{"id": "b\\ud83d", "url": "https://x.example/b.jpg"}\n'
        '{"id": "c", "url": "https://x.example/c\\ude00.jpg"}\n'
        '{"id": "d", "url": "https://x.example/d.jpg", "brand": "\\\\ud83d \\ud83d\\ude00"}\n'
    )
    code, err, outcomes, front = await _run([manifest])
    assert code == 0, err
    assert not front.violations, front.violations
    assert sorted(outcomes.ids) == ["a", "d"]
    sent = {
        r["context"]["id"]: r["context"].get("brand")
        for _, _, body in front.bodies
        for r in body.get("taggingRequest", [])
    }
    assert sent == {"a": "Smile \ufffd", "d": "\\ud83d \U0001f600"}
    rejects = {r["line"]: r for r in outcomes.rejects}
    assert set(rejects) == {2, 3}
    assert rejects[2]["id"] is None and rejects[3]["id"] == "c"
    for r in rejects.values():
        assert "half of a UTF-16 surrogate pair" in r["reason"], r
