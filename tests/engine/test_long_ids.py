"""Ids longer than a state store can key (each test failed before its fix): the row is one
reject saying so, never a run that fails on it every night."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args


def _long(n: int) -> str:
    """``n`` characters no compression shortens (a signed URL's token, a hash chain)."""
    return secrets.token_urlsafe(n)[:n]


async def test_an_id_too_long_to_key_is_one_reject_on_either_state(
    tmp_path: Path, state_location: Callable[[str], Path | str]
) -> None:
    """A manifest row whose id is ~3 KB (a URL list's signed URL, an id column holding a
    description): with a PostgreSQL state, the run failed on writing it ("index row size
    exceeds btree version 4 maximum 2704"), nothing written, and failed the same on every
    run again. Now such an id is a client reject with that reason, on either state."""
    long_url = "https://cdn.example/img.jpg?sig=" + _long(3000)
    emoji = "\U0001f600" * 600  # 600 characters, 2,400 bytes
    urls = tmp_path / "list.txt"
    urls.write_text(f"https://cdn.example/a.jpg\n{long_url}\nhttps://cdn.example/b.jpg\n")
    plain = tmp_path / "plain.csv"
    plain.write_text(
        f"id,url\nc1,https://x.example/1.jpg\n{_long(2900)}x,https://x.example/2.jpg\n"
    )
    context = tmp_path / "context.csv"
    context.write_text(
        "id,url,brand\n"
        "k1,https://x.example/k1.jpg,B\n"
        f"{emoji},https://x.example/k2.jpg,B\n"
        f"{_long(2800)}y,https://x.example/k3.jpg,B,extra field\n"
        "k4,https://x.example/k4.jpg,B\n"
    )
    jsonl = tmp_path / "rows.jsonl"
    long_j1, long_j2 = _long(2800) + "j", _long(2700) + "z"
    jsonl.write_text(
        json.dumps({"id": "j1", "url": "https://x.example/j1.jpg"})
        + "\n"
        + json.dumps({"id": long_j1, "url": "https://x.example/j2.jpg"})
        + "\n"
        + json.dumps({"context": {"id": long_j2, "brand": "B"}, "url": "https://x.example/j3.jpg"})
        + "\n"
    )
    manifests = [urls, plain, context, jsonl]
    out = tmp_path / "out.jsonl"
    state = state_location("long")
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), *map(str, manifests))
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    short = {"https://cdn.example/a.jpg", "https://cdn.example/b.jpg", "c1", "k1", "k4", "j1"}
    rejects = [json.loads(line) for line in out.with_suffix(".rej").read_text().splitlines()]
    too_long = {r["id"] for r in rejects}
    outcomes = assert_exactly_once(out, out.with_suffix(".rej"), short | too_long)
    assert {r["id"] for r in outcomes.results} == short
    assert long_url in too_long and emoji in too_long and {long_j1, long_j2} <= too_long
    assert len(rejects) == 6
    for r in rejects:
        if r["reason"].startswith("row has"):
            continue  # (the row with a field too many: that is its reason)
        assert r["stage"] == "client" and "2048 bytes" in r["reason"], r
