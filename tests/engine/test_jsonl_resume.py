"""JSONL manifests (read and validated a block at a time) killed mid-run and resumed: from a
file, gzip, stdin, with --reuse; blank, bad and CRLF lines in the first block and at a block's
edge keep their line numbers."""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import subprocess
from pathlib import Path

import anyio
import anyio.abc
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline.engine.state import split_position
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, job_marks, kill_when, read_outcomes, run_args

N = 2400
BLOCK = 500


def _jsonl(n: int = N, *, url: str = "https://img.example/{i}.jpg") -> bytes:
    lines = [json.dumps({"id": f"p{i}", "url": url.format(i=i), "brand": "acme"}) for i in range(n)]
    # In the first block: a blank line, a bad line, a CRLF line; at the block's edge likewise.
    specials = {2: "", 3: '{"id": "bad1", "url": "ftp://x/y"}', 4: None}
    for at, text in sorted(specials.items(), reverse=True):
        if text is None:
            lines[at] = lines[at] + "\r"
        else:
            lines.insert(at, text)
    for at in (BLOCK - 1, BLOCK, BLOCK + 1):
        lines.insert(at, "")
    lines.insert(BLOCK * 2, "{not json")
    lines.insert(BLOCK * 2 + 1, '{"id": "bad2", "url": "ftp://x/y"}')
    lines[BLOCK * 3] += "\r"
    lines.insert(BLOCK * 3 + 1, "   ")
    return ("\n".join(lines) + "\n").encode()


IDS: set[str | None] = {f"p{i}" for i in range(N)} | {"bad1", "bad2", None}


def _config(tmp_path: Path) -> str:
    path = tmp_path / "c.toml"
    path.write_text(
        f"[client.timeout]\ntotal = 3.0\n\n[engine]\nlist_lag = 0.5\nread_batch_rows = {BLOCK}\n"
        "chunk_size = 500\n"
    )
    return str(path)


def _validated(state: Path) -> int:
    """The line up to which the state's job took its manifest's rows in (-1: none yet)."""
    validated = job_marks(state)[0]
    return split_position(validated)[1] if validated >= 0 else -1


def _rejects(out: Path) -> list[tuple[object, ...]]:
    o = read_outcomes(out, out.with_suffix(".rej"))
    # (a duplicate's reason names the manifest: the reference run's is another path)
    return sorted(
        (r["id"] or "", re.sub(r"at \S+ line", "at M line", r["reason"]), r["line"])
        for r in o.rejects
    )


async def _reference(tmp_path: Path, url: str, data: bytes) -> list[tuple[object, ...]]:
    ref = tmp_path / "ref"
    ref.mkdir()
    m = ref / "m.jsonl"
    m.write_bytes(data)
    out = ref / "out.jsonl"
    done = await anyio.run_process(
        run_args(url, out, str(m), "--config", _config(tmp_path)), check=False, env=ENV
    )
    assert done.returncode == 0, done.stderr.decode()[-800:]
    return _rejects(out)


def _expected_ids() -> set[str]:
    return IDS  # type: ignore[return-value]  # (the line that is no JSON has no id)


def _odd(data: bytes) -> bytes:
    """``data`` with a line holding a byte that is not UTF-8 and lines of JSON that are no
    object (a string, a number, a list, null) in its second block."""
    lines = data.split(b"\n")
    at = BLOCK + 200
    lines[at:at] = [b'{"id": "odd", "url": "https://img.example/\xff.jpg"}', b'"text"', b"5"]
    lines[at + 400 : at + 400] = [b"[1, 2]", b"null"]
    return b"\n".join(lines)


def _dups(data: bytes) -> bytes:
    """``data`` with an id of the first block again at a block's edge, and one of the last
    block's ahead of it (its own row then the duplicate), both as JSON with other keys."""
    lines = data.split(b"\n")
    lines.insert(BLOCK * 2 - 1, b'{"id": "p10", "url": "https://img.example/again.jpg"}')
    lines.insert(BLOCK + 3, b'{"url": "https://img.example/early.jpg", "id": "p2300"}')
    return b"\n".join(lines)


def _mixed(data: bytes) -> bytes:
    """``data`` with rows of other key orders among the plain ones: fields in a context
    object, an ``ID`` key, a product name, and images as data: URIs (the single endpoint)."""
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), (200, 30, 30)).save(buf, "PNG")
    png = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    lines = data.split(b"\n")
    for k, line in enumerate(lines):
        if not line.startswith(b'{"id": "p'):
            continue
        obj = json.loads(line)
        if k % 7 == 0:
            obj = {"context": {"id": obj["id"], "brand": "acme"}, "url": obj["url"]}
        elif k % 11 == 0:
            obj = {"ID": obj["id"], "url": obj["url"], "productName": "coat"}
        elif k % 53 == 0:
            obj["url"] = png
        lines[k] = json.dumps(obj).encode() + (b"\r" if line.endswith(b"\r") else b"")
    return b"\n".join(lines)


@pytest.mark.parametrize("kind", ["plain", "gzip", "reuse", "dups", "mixed", "odd"])
@pytest.mark.parametrize("when", ["early", "results"])
async def test_a_jsonl_manifest_killed_and_resumed(tmp_path: Path, kind: str, when: str) -> None:
    made = {"dups": _dups, "mixed": _mixed, "odd": _odd}.get(kind)
    data = _jsonl() if made is None else made(_jsonl())
    m = tmp_path / ("m.jsonl.gz" if kind == "gzip" else "m.jsonl")
    m.write_bytes(gzip.compress(data) if kind == "gzip" else data)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    extra = ["--reuse", str(tmp_path / "store.db")] if kind == "reuse" else []
    async with running_service(ServiceConfig(rate=800.0)) as svc:
        expected = await _reference(tmp_path, svc.url, data)
        args = run_args(svc.url, out, str(m), "--config", _config(tmp_path), "--state", str(state))
        args += extra
        if kind == "reuse":  # a store holding part of the catalogue's answers
            part = tmp_path / "part.jsonl"
            part.write_bytes(b"\n".join(data.split(b"\n")[:700]) + b"\n")
            last = run_args(svc.url, tmp_path / "last.jsonl", str(part), *extra)
            assert (await anyio.run_process(last, check=False, env=ENV)).returncode == 0
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
        if when == "early":
            await kill_when(proc, lambda: _validated(state) > 600)
        else:
            await kill_when(proc, lambda: out.exists() and out.stat().st_size > 50_000)
        with anyio.fail_after(120):
            done = await anyio.run_process(args, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()[-800:]
    if kind == "odd":  # (four rejects without an id: checked as the reference's)
        results = [r["id"] for r in read_outcomes(out, out.with_suffix(".rej")).results]
        assert sorted(results) == sorted(f"p{i}" for i in range(N))
    else:
        dups = 2 if kind == "dups" else 0
        assert_exactly_once(out, out.with_suffix(".rej"), _expected_ids(), duplicates=dups)
    assert _rejects(out) == expected


@pytest.mark.parametrize(
    "change",
    [
        "same",
        "same-gzip",
        "same-odd",
        "changed",
        "shorter",
        "changed-odd",
        "no-flag",
        "same-reuse",
        "same-twice",
    ],
)
async def test_a_jsonl_stdin_killed_and_resumed(tmp_path: Path, change: str) -> None:
    data = _jsonl()
    if change.endswith("-odd"):
        data = _odd(data)
    piped = tmp_path / "piped.jsonl"
    piped.write_bytes(gzip.compress(data) if change.endswith("gzip") else data)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=800.0)) as svc:
        expected = await _reference(tmp_path, svc.url, data)
        args = run_args(svc.url, out, "-", "--config", _config(tmp_path), "--state", str(state))
        if change == "same-reuse":  # a store holding the answers of the first 700 lines
            store = ["--reuse", str(tmp_path / "store.db")]
            args += store
            part = tmp_path / "part.jsonl"
            part.write_bytes(b"\n".join(data.split(b"\n")[:700]) + b"\n")
            last = run_args(svc.url, tmp_path / "last.jsonl", str(part), *store)
            assert (await anyio.run_process(last, check=False, env=ENV)).returncode == 0
        with piped.open("rb") as stdin:
            proc = await anyio.open_process(args, stdin=stdin, stderr=subprocess.DEVNULL, env=ENV)
            # (Lines answered from the store are written before the commit that takes their
            # ids in: on a loaded machine 50 KB of them came before any commit.)
            await kill_when(
                proc, lambda: out.exists() and out.stat().st_size > 50_000 and _validated(state) > 0
            )
        assert _validated(state) > 0
        if change == "changed":
            piped.write_bytes(_jsonl(url="https://img.example/v2/{i}.jpg"))
        elif change == "changed-odd":  # (a row past the line with a stray byte)
            piped.write_bytes(data.replace(b'"p800"', b'"p800x"'))
        elif change == "same-twice":  # the resume killed too, further on
            with piped.open("rb") as stdin:
                proc = await anyio.open_process(
                    [*args, "--resume"], stdin=stdin, stderr=subprocess.DEVNULL, env=ENV
                )
                await kill_when(proc, lambda: out.stat().st_size > 250_000)
        elif change == "shorter":
            piped.write_bytes(b"\n".join(data.split(b"\n")[:300]) + b"\n")
        with piped.open("rb") as stdin, anyio.fail_after(120):
            done = await anyio.run_process(
                [*args] if change == "no-flag" else [*args, "--resume"],
                stdin=stdin,
                check=False,
                env=ENV,
            )
    message = done.stderr.decode()
    if change.startswith("same"):
        assert done.returncode == 0, message[-800:]
        if change == "same-odd":  # (four rejects without an id: checked as the reference's)
            results = [r["id"] for r in read_outcomes(out, out.with_suffix(".rej")).results]
            assert sorted(results) == sorted(f"p{i}" for i in range(N))
        else:
            assert_exactly_once(out, out.with_suffix(".rej"), _expected_ids())
        assert _rejects(out) == expected
    else:
        assert done.returncode == 2, message[-800:]
        assert "Traceback" not in message
        if change == "no-flag":
            assert "--resume" in message, message[-800:]
        else:
            assert "stdin does not carry the rows" in message, message[-800:]


async def test_a_jsonl_manifest_edited_before_its_watermark_is_refused(tmp_path: Path) -> None:
    data = _jsonl()
    m = tmp_path / "m.jsonl"
    m.write_bytes(data)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    async with running_service(ServiceConfig(rate=800.0)) as svc:
        args = run_args(svc.url, out, str(m), "--config", _config(tmp_path), "--state", str(state))
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
        await kill_when(proc, lambda: _validated(state) > 600)
        m.write_bytes(data.replace(b'"p5"', b'"p5x"', 1))
        with anyio.fail_after(60):
            done = await anyio.run_process(args, check=False, env=ENV)
    message = done.stderr.decode()
    assert done.returncode == 2, message[-800:]
    assert "Traceback" not in message
