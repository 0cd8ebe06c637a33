"""A run stopped by an earlier build and resumed by this one, where this build reads a row the
earlier one refused (each test failed before its fix): the row keeps the reject the run wrote,
and is neither sent nor given a result as well."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, dead_port, read_outcomes, run_args, run_piped

#: ``fashiontag run`` as a build before 070f02d ran it: a JSONL line escaping half of a UTF-16
#: surrogate pair (``"\\ud83d"``) was a ``not valid JSON`` reject without its id.
BEFORE_HALF_PAIRS = (
    "from fashiontag_pipeline.engine import strays\nstrays.screen_escapes = lambda text: None\n"
)
#: ... and before 61b8298: a header ending with a delimiter named a third column, and a row
#: without that cell was a ``row has 2 fields`` reject.
BEFORE_UNNAMED_ENDS = (
    "from fashiontag_pipeline.engine import source\nsource.unnamed_end = lambda names: 0\n"
)
_MAIN = (
    "from fashiontag_pipeline.cli import main\n"
    "import sys\n"
    "sys.argv[0] = 'fashiontag'\n"
    "sys.exit(main())\n"
)

#: Rows of the manifests below, and every how many one this build reads and the earlier did not.
_ROWS, _EVERY = 30_000, 500


def _jsonl(path: Path) -> dict[int, str]:
    """A JSONL manifest (some rows with half a surrogate pair); its ids by line."""
    with path.open("w") as fh:
        for i in range(_ROWS):
            if i % _EVERY == 7:
                half = '"brand": "\\ud83d"'  # (an emoji cut in two by the exporter)
                fh.write(f'{{"id": "a{i}", "url": "https://x.example/{i}.jpg", {half}}}\n')
            else:
                fh.write(json.dumps({"id": f"a{i}", "url": f"https://x.example/{i}.jpg"}) + "\n")
    return {i + 1: f"a{i}" for i in range(_ROWS)}


def _csv(path: Path) -> dict[int, str]:
    """A CSV manifest whose header ends with a delimiter (some rows without the cell); its
    ids by line."""
    with path.open("w") as fh:
        fh.write("id,url,\n")
        for i in range(_ROWS):
            if i % _EVERY == 7:
                fh.write(f"a{i},https://x.example/{i}.jpg\n")
            else:
                fh.write(f"a{i},https://x.example/{i}.jpg,\n")
    return {i + 2: f"a{i}" for i in range(_ROWS)}


def _window(state: Path) -> tuple[int, int]:
    db = sqlite3.connect(state)
    try:
        ((validated, chunked),) = db.execute("SELECT validated, chunked FROM jobs")
    finally:
        db.close()
    return int(chunked), int(validated)


def _check(out: Path, ids: dict[int, str], first_rejects: list[dict[str, Any]]) -> None:
    """Every row once (``ids``: by line): the rows the earlier build refused keep its
    rejects, not sent; every other row, the refused kind past V too, has its result."""
    assert first_rejects
    refused = {ids[r["line"]] for r in first_rejects}
    o = read_outcomes(out, out.with_suffix(".rej"))
    results = [r["id"] for r in o.results]
    assert len(results) == len(set(results)), "a row has two results"
    assert not refused & set(results), sorted(refused & set(results))[:5]
    assert set(results) == set(ids.values()) - refused
    assert o.rejects == first_rejects


@pytest.mark.parametrize(
    ("old", "make", "name"),
    [(BEFORE_HALF_PAIRS, _jsonl, "m.jsonl"), (BEFORE_UNNAMED_ENDS, _csv, "m.csv")],
    ids=["half-surrogate-jsonl", "csv-header-trailing-delimiter"],
)
async def test_a_row_an_earlier_build_refused_keeps_its_reject_on_resume(
    tmp_path: Path, old: str, make: Callable[[Path], dict[int, str]], name: str
) -> None:
    """An earlier build refused a row (half a surrogate pair escaped; a CSV row without the
    cell its header's trailing delimiter named) and stopped before the row's window (W, V]
    was chunked (the service unreachable). This build, resuming, read the row, sent it and
    wrote its result: the row had a reject and a result, and the run exited 3, 'the state
    cannot be trusted ... --restart' (which bills every row again). Now the row keeps the
    reject the run wrote: not sent, exit 0, every row once."""
    manifest = tmp_path / name
    ids = make(manifest)
    out, state = tmp_path / "out.jsonl", tmp_path / "run.state"
    dead = f"http://127.0.0.1:{dead_port()}"
    args = run_args(dead, out, "--state", str(state), "--give-up-after", "1", str(manifest))
    first = await anyio.run_process(
        [sys.executable, "-c", old + _MAIN, *args[3:]], check=False, env=ENV
    )
    assert first.returncode == 1, first.stderr.decode()[-3000:]
    chunked, validated = _window(state)
    first_rejects = read_outcomes(out, out.with_suffix(".rej")).rejects
    lines = {r["line"] for r in first_rejects}
    assert any(chunked < line <= validated for line in lines), (chunked, validated, lines)
    async with running_service(ServiceConfig(fetch=False)) as svc:
        args = run_args(svc.url, out, "--state", str(state), str(manifest))
        resumed = await anyio.run_process(args, check=False, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    _check(out, ids, first_rejects)


#: ``fashiontag run`` as a build whose checks refused a row this build reads, without its id
#: (a JSONL line it could not parse): here, a row whose id begins ``loose``. (Its rows are read
#: alike, so a stdin resume's digest of them is the same.)
STRICTER_ROWS = (
    "from fashiontag_pipeline.engine import validate\n"
    "from fashiontag_pipeline.engine.sinks import Reject\n"
    "from fashiontag_pipeline.engine.state import split_position\n"
    "route = validate.Validator.route\n"
    "def stricter(self, batch, *, skip_upto=-1):\n"
    "    items, singles, rejects = route(self, batch, skip_upto=skip_upto)\n"
    "    refused = [(p, Reject(None, 'refused', 'client', split_position(p)[1], batch.name))\n"
    "               for i, p, _ in items if i.startswith('loose')]\n"
    "    items = [item for item in items if not item[0].startswith('loose')]\n"
    "    return items, singles, sorted(rejects + refused, key=lambda r: r[0])\n"
    "validate.Validator.route = stricter\n"
)


async def test_a_stdin_resume_of_a_row_an_earlier_build_refused_keeps_its_reject(
    tmp_path: Path,
) -> None:
    """The same, piped on stdin (``run - --resume``): the resume refused the dump, 'stdin
    does not carry the rows of the run being resumed: line N has id ..., which that run did
    not read there', though the same rows were piped again (the run read no id at that line,
    and wrote its reject). Now the row, at a line with a reject, keeps that reject: the resume
    goes on, not sending it, every row once."""
    dump = tmp_path / "dump.csv"
    ident = [f"loose{i}" if i % _EVERY == 7 else f"a{i}" for i in range(_ROWS)]
    dump.write_text("id,url\n" + "".join(f"{d},https://x.example/{d}.jpg\n" for d in ident))
    out = tmp_path / "out.jsonl"
    dead = f"http://127.0.0.1:{dead_port()}"
    args = run_args(dead, out, "--give-up-after", "1", "-")
    first = await run_piped([sys.executable, "-c", STRICTER_ROWS + _MAIN, *args[3:]], dump)
    assert first.returncode == 1, first.stderr.decode()[-3000:]
    first_rejects = read_outcomes(out, out.with_suffix(".rej")).rejects
    assert all(r["reason"] == "refused" for r in first_rejects)
    async with running_service(ServiceConfig(fetch=False)) as svc:
        resumed = await run_piped([*run_args(svc.url, out, "-"), "--resume"], dump)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    _check(out, {i + 2: d for i, d in enumerate(ident)}, first_rejects)
