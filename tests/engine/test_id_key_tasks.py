"""Ids a service makes one (``a0`` and ``A0``, ``" x"`` and ``"x"``, ``007`` and ``7``) never
share a task, so every result a service returns under a changed id is told apart.

Before, such ids went to one task; a service that upper-cased (stripped, wrote as a number)
the ids it echoed returned ``a0``'s result as ``A0``, which matched the sent ``A0`` exactly:
row ``A0`` was written with image ``a0``'s tagging result (and ``a0`` with ``A0``'s, or sent
again), exit 0. Each test compares every result with a run of the same manifest through a
service that changes no id (the reference service's result depends on the image alone).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unicodedata import category
from urllib.parse import unquote_plus

import anyio
import pytest

from fashiontag_pipeline.engine.idkeys import coarse_keys, keyed
from fashiontag_pipeline.engine.idmatch import id_key
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, kill_when, run_args
from .proxy import Misbehaviour, misbehaving

#: Pairs inside one chunk, and ``SKU-…`` ids whose lower-case twins went to the same task in
#: an earlier chunk (tasks of 3,000 rows, chunks of 1,000).
IDS = (
    [f"a{i}" for i in range(50)]
    + [f"A{i}" for i in range(50)]
    + [" x", "x", "007", "7", "Caf\u00e9", "cafe\u0301"]
    + [f"sku-{i}" for i in range(1200)]
    + [f"SKU-{i}" for i in range(0, 1200, 7)]
)


def _echo(ident: str) -> Any:
    """What the service makes of an id it echoes: stripped, upper-cased, NFC, a number."""
    text = ident.strip().upper()
    return int(text) if text.isdigit() else text


def _config(folder: Path) -> str:
    path = folder / "engine.toml"
    path.write_text(
        "[engine]\npoll_min = 0.02\npoll_max = 0.2\nlinger_seconds = 0.2\n"
        "rotate_images = 3000\nrotate_min_images = 3000\n"
        # rows whose results come back under another id are never returned: each send's
        # pages are read again for this long (30 s by default) before the next send
        "read_again_window = 1.0\n"
    )
    return str(path)


def _manifest(folder: Path) -> Path:
    path = folder / "m.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": ident, "url": f"https://img.example/{n}.jpg"}) + "\n"
            for n, ident in enumerate(IDS)
        )
    )
    return path


def _results(out: Path) -> dict[str, Any]:
    """Each id's tagging result (None: rejected); every id ends once."""
    o = assert_exactly_once(out, out.with_suffix(".rej"), set(IDS))
    return {r["id"]: r["taggingResult"] for r in o.results} | {r["id"]: None for r in o.rejects}


def _assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    wrong = sorted(i for i in IDS if got[i] is not None and got[i] != expected[i])
    assert not wrong, f"{len(wrong)} rows written with another row's result: {wrong[:10]}"
    rejected = sorted(i for i in IDS if got[i] is None)
    assert not rejected, f"{len(rejected)} rows rejected: {rejected[:10]}"


async def _run(url: str, folder: Path, *extra: str) -> dict[str, Any]:
    folder.mkdir()
    out = folder / "out.jsonl"
    args = run_args(url, out, str(_manifest(folder)), "--config", _config(folder), *extra)
    with anyio.fail_after(120):
        done = await anyio.run_process(args, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return _results(out)


async def test_ids_a_service_makes_one_are_never_in_one_task(tmp_path: Path) -> None:
    async with running_service(ServiceConfig()) as svc:
        expected = await _run(svc.url, tmp_path / "plain")
        async with misbehaving(svc.url, Misbehaviour(echo_id=_echo)) as proxy:
            got = await _run(proxy.url, tmp_path / "changed")
    _assert_same(got, expected)


async def test_a_resume_after_a_kill_keeps_them_apart(tmp_path: Path) -> None:
    """Killed (SIGKILL) with tasks open, the resume sends the rest apart too."""
    async with running_service(ServiceConfig()) as svc:
        expected = await _run(svc.url, tmp_path / "plain")
    folder = tmp_path / "changed"
    folder.mkdir()
    out, state = folder / "out.jsonl", folder / "run.state"
    args = run_args("", out, str(_manifest(folder)), "--config", _config(folder))
    args += ["--state", str(state)]

    def chunks_sent() -> bool:
        try:
            with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as db:
                (n,) = db.execute(
                    "SELECT count(*) FROM chunks WHERE task_id IS NOT NULL"
                ).fetchone()
        except sqlite3.Error:
            return False
        return int(n) >= 1

    async with (
        running_service(ServiceConfig(rate=400.0)) as svc,
        misbehaving(svc.url, Misbehaviour(echo_id=_echo)) as proxy,
    ):
        args[args.index("--base-url") + 1] = proxy.url
        proc = await anyio.open_process(args, stderr=subprocess.DEVNULL, env=ENV)
        await kill_when(proc, chunks_sent)
        with anyio.fail_after(120):
            done = await anyio.run_process(args, check=False, env=ENV)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = _results(out)
    _assert_same(got, expected)


@pytest.mark.parametrize(
    "ident",
    [
        " sku 7\t",
        "Sku  7",
        "cafe\u0301",
        "CAF\u00c9",
        "007",
        "+7",
        "-007",
        "-0",
        "000",
        "\u0130stanbul",
        "Stra\u00dfe",
        "\u1e9e",
        "a \u0301b",
        "x\u3000y",
        "\u2000z",
    ],
)
def test_the_coarse_key_joins_what_id_key_joins(ident: str) -> None:
    """Every id has the coarse key of its :func:`id_key` (so ids of one ``id_key`` have one
    coarse key), and of its changes a service makes."""
    changes = [id_key(ident), ident.upper(), ident.lower(), ident.strip(), f"  {ident} "]
    keys = coarse_keys([ident, *changes])
    assert set(keys) == {keys[0]}, (ident, keys)


def test_the_coarse_key_of_every_code_point() -> None:
    """Over every assigned code point alone, between a letter and a digit, and between a
    digit and a combining mark: the coarse key of an id is
    that of its :func:`id_key`."""
    chars = [c for c in map(chr, range(1, 0x110000)) if category(c) not in ("Cn", "Co", "Cs")]
    ids = [text for c in chars for text in (c, "a" + c + "0", "0" + c + "\u0301")]
    assert coarse_keys(ids) == coarse_keys([id_key(i) for i in ids])
    ids = ["a", "B", "a01", "7", "007", "+07", "-0", "0", "0 07", "7a", "07a", "1-0"]
    assert coarse_keys(ids) == ["a", "b", "a01", "7", "7", "7", "0", "0", "7", "7a", "07a", "1-0"]
    assert keyed(["sku-1", "sku-2"]) == {"sku-1", "sku-2"}  # their own keys
    assert keyed(["a0", "A0", " b"]) == {"a0", "b"}


#: Ids a service that NFKC-normalises (full-width digits, ligatures) or drops invisible
#: characters (zero-width space, soft hyphen, byte order mark) returns as another id of the run
#: exactly, each changed one first and its twin on a later result page of the same task.
_INVISIBLE = ["\uff11\uff12\uff13", "a\u200bb", "x\u00adz", "\ufeffbom", "\uff2e\u2060o"]
_TWINS = ["123", "ab", "xz", "bom", "No"]


def _unseen(ident: str) -> Any:
    return "".join(c for c in unicodedata.normalize("NFKC", ident) if category(c) != "Cf")


async def _kept_apart(
    folder: Path,
    changed: list[str],
    twins: list[str],
    echo: Callable[[str], Any],
    matched: frozenset[str] = frozenset(),
) -> None:
    """Each of ``changed`` (which ``echo`` makes its twin exactly) first, its twin on a later
    result page of the same task: no row is written with another row's result, and the rows
    ``echo`` changes alone end rejected (their results come back under ids their tasks lack),
    but those of ``matched`` (a change :func:`id_key` undoes), which get their own."""
    ids = changed + [f"p{i}" for i in range(1500)] + twins

    async def run(url: str, sub: Path) -> dict[str, Any]:
        sub.mkdir(parents=True)
        manifest = sub / "m.jsonl"
        manifest.write_text(
            "".join(
                json.dumps({"id": i, "url": f"https://img.example/{n}.jpg"}) + "\n"
                for n, i in enumerate(ids)
            )
        )
        out = sub / "out.jsonl"
        args = run_args(url, out, str(manifest), "--config", _config(sub))
        with anyio.fail_after(120):
            done = await anyio.run_process(args, check=False, env=ENV)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        o = assert_exactly_once(out, out.with_suffix(".rej"), set(ids))
        return {r["id"]: r["taggingResult"] for r in o.results} | {r["id"]: None for r in o.rejects}

    async with running_service(ServiceConfig()) as svc:
        expected = await run(svc.url, folder / "plain")
        async with misbehaving(svc.url, Misbehaviour(echo_id=echo)) as proxy:
            got = await run(proxy.url, folder / "changed")
    wrong = sorted(i for i in ids if got[i] is not None and got[i] != expected[i])
    assert not wrong, f"rows written with another row's result: {wrong}"
    unmatched = sorted(i for i in ids if echo(i) != i and i not in matched)
    assert sorted(i for i in ids if got[i] is None) == unmatched


async def test_ids_a_service_makes_one_by_nfkc_or_invisible_characters_stay_apart(
    tmp_path: Path,
) -> None:
    """Before, ``a<zero-width space>b`` and ``ab`` (full-width ``123`` and ``123``) went to
    one task: the first's result came back as ``ab``, matched exactly, and row ``ab`` was
    written with image ``a<ZWSP>b``'s tagging result. Now they go to two tasks; the result
    under a changed id no row of its task has is none, and that row alone ends rejected after
    its sends."""
    await _kept_apart(tmp_path, _INVISIBLE, _TWINS, _unseen)


async def test_ids_a_service_makes_one_by_percent_decoding_stay_apart(tmp_path: Path) -> None:
    """Before, ``a%20b`` and ``a b`` (``c%2541`` and ``c%41``, ``x+y`` and ``x y``) went to
    one task: a service that URL-decodes the ids it echoes returned the first's result as the
    second exactly, and row ``a b`` was written with image ``a%20b``'s tagging result. The
    ids changed only by their percent escapes get their own results (:func:`id_key` undoes
    those), ``x+y`` none (``+`` is left as it is)."""
    changed = ["a%20b", "c%2541", "x+y", "caf%C3%A9"]
    twins = ["a b", "c%41", "x y", "caf\u00e9"]
    matched = frozenset(["a%20b", "c%2541", "caf%C3%A9", "c%41"])
    await _kept_apart(tmp_path, changed, twins, unquote_plus, matched)
