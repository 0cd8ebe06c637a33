"""Other legitimate readings of the spec: a service that is not the reference one.

The spec leaves open much the reference service settles its own way (the words of a
``status``, the JSON type a count is written in, ...). Each test runs ``fashiontag run`` over
HTTP against the reference service behind the misbehaving proxy (:mod:`.proxy`), its answers
rewritten as such a service would write them, and checks the promises: every row once in the
outputs, none billed twice, exit code and summary right.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, ids_of, read_outcomes, run_args, write_csv
from .proxy import BULK, MisbehavingProxy, Misbehaviour, request_kind

#: (request kind, the answer's JSON) -> the JSON to answer instead (or a whole answer).
Rewrite = Callable[[str, Any], Any]
#: Tasks of 1,000 rows, polled fast; a service that cannot be understood stops the run soon.
FLAGS = (
    "--rotate-images",
    "1000",
    "--rotate-min-images",
    "1000",
    "--linger",
    "0.2",
    "--give-up-after",
    "4",
)


class Rewriting(MisbehavingProxy):
    """The misbehaving proxy (no misbehaviour of its own) whose 2xx JSON answers are passed
    through ``rewrite``."""

    def __init__(self, rewrite: Rewrite) -> None:
        super().__init__("", Misbehaviour())
        self.rewrite = rewrite

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = await super().handle(request)
        if not (isinstance(answer, web.Response) and isinstance(answer.body, bytes)):
            return answer
        if answer.status >= 300 or not answer.body:
            return answer
        data = self.rewrite(request_kind(request.method, request.path), json.loads(answer.body))
        if isinstance(data, web.Response):  # an answer of another status or headers
            return data
        return web.json_response(data, status=answer.status)


async def run_cli(
    tmp_path: Path, n: int, rewrite: Rewrite, *flags: str
) -> tuple[int, dict[str, Any], str]:
    """``fashiontag run`` of ``n`` rows (more ``flags``) through a :class:`Rewriting` proxy:
    (exit code, the ``--summary`` JSON, stderr)."""
    manifest = write_csv(tmp_path / "m.csv", n)
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(ServiceConfig()) as svc:
        proxy = Rewriting(rewrite)
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(
                proxy.url, out, str(manifest), "--summary", str(summary), *FLAGS, *flags
            )
            with anyio.fail_after(60):
                done = await anyio.run_process(args, check=False, env=ENV)
    written = json.loads(summary.read_text()) if summary.exists() else {}
    return done.returncode, written, done.stderr.decode()


def each_once(tmp_path: Path, n: int) -> list[dict[str, Any]]:
    """The results lines, once each of the ``n`` ids, no rejects."""
    o = read_outcomes(tmp_path / "out.jsonl", tmp_path / "out.rej")
    assert not o.rejects
    assert len(o.ids) == n and set(o.ids) == ids_of(n)
    return o.results


def _envelope_in(word: str) -> Rewrite:
    def rewrite(kind: str, data: Any) -> Any:
        if kind in ("list", "status", "results") and data.get("status") == "success":
            data["status"] = word
        return data

    return rewrite


@pytest.mark.parametrize("word", ["SUCCESS", "Success"])
async def test_a_request_status_of_success_in_another_case(tmp_path: Path, word: str) -> None:
    """The task list, the status and the results pages say ``"status": "SUCCESS"`` (the spec
    leaves its values open: "success or failure of the request"). Every poll was taken as the
    service's refusal and asked again until ``--give-up-after``: exit 1, no row written, and
    every resume the same. The request status is read in any case."""
    code, summary, err = await run_cli(tmp_path, 2000, _envelope_in(word))
    assert code == 0, err[-600:]
    assert summary["tagged"] == 2000 and summary["failed"] == 0 and summary["resent"] == 0
    each_once(tmp_path, 2000)


def _results_in(word: str) -> Rewrite:
    def rewrite(kind: str, data: Any) -> Any:
        if kind == "results":
            for row in data["data"]["results"]:
                if row["taggingResult"]["status"] == "success":
                    row["taggingResult"]["status"] = word
        return data

    return rewrite


async def test_tagging_results_whose_status_says_success_in_another_case(tmp_path: Path) -> None:
    """Every tagging result says ``"status": "SUCCESS"`` (the spec: "Allowed values: not
    shown"). Each was counted a failed tagging: the summary said 0 tagged and 2,000 failed
    (``--reuse`` stores only successes, so such rows were billed again every night). They are
    tagged; the lines keep the service's word."""
    code, summary, err = await run_cli(tmp_path, 2000, _results_in("SUCCESS"))
    assert code == 0, err[-600:]
    assert (summary["tagged"], summary["failed"], summary["resent"]) == (2000, 0, 0)
    results = each_once(tmp_path, 2000)
    assert {r["taggingResult"]["status"] for r in results} == {"SUCCESS"}


def _as_text(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _as_text(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_as_text(v) for v in node]
    return str(node) if isinstance(node, int) and not isinstance(node, bool) else node


def _counts_as_text(kind: str, data: Any) -> Any:
    return _as_text(data) if kind in ("create", "append", "list", "status") else data


async def test_counts_written_as_strings(tmp_path: Path) -> None:
    """A service writing every integer of its write answers, task list and status as a
    string (``"total": "1000"``, ``"accept": "1000"``, ``"totalCount": "3"``: a JSON writer
    that quotes 64-bit integers). The list and status were unreadable (exit 1 after
    ``--give-up-after``, every resume the same). Integers written as strings are read."""
    code, summary, err = await run_cli(tmp_path, 2000, _counts_as_text)
    assert code == 0, err[-600:]
    assert (summary["tagged"], summary["resent"]) == (2000, 0)
    each_once(tmp_path, 2000)


def _created_201(kind: str, data: Any) -> Any:
    if kind != "create":
        return data
    return web.json_response(data, status=201, headers={"Location": f"{BULK}/{data['taskId']}"})


def _appends_refused_409(kind: str, data: Any) -> Any:
    if kind != "append":
        return data
    return web.json_response({"status": "failure", "error": "task is processing"}, status=409)


TASKS_OF_3000 = ("--rotate-images", "3000", "--rotate-min-images", "3000")


@pytest.mark.parametrize(
    ("rewrite", "flags"),
    [(_created_201, ()), (_appends_refused_409, TASKS_OF_3000)],
    ids=["create-201-location", "append-409-processing"],
)
async def test_writes_answered_in_statuses_the_spec_does_not_show(
    tmp_path: Path, rewrite: Rewrite, flags: tuple[str, ...]
) -> None:
    """Creates answered ``201 Created`` with a ``Location`` (the spec shows 202), or every
    append to a task refused ``409`` once it is processing (the spec shows no status for it):
    each row tagged once, none sent twice (found to hold; kept as a guard)."""
    code, summary, err = await run_cli(tmp_path, 3000, rewrite, *flags)
    assert code == 0, err[-600:]
    assert (summary["tagged"], summary["resent"]) == (3000, 0)
    each_once(tmp_path, 3000)


async def test_the_sqlite_sinks_status_column_agrees_with_the_summary(tmp_path: Path) -> None:
    """Found in review: with ``--sink sqlite`` the tagging results that say ``SUCCESS`` were
    counted tagged (2,000 in the summary) while the ``status`` column kept the service's word:
    ``WHERE status = 'success'`` found none of them. The column says ``success`` for them (the
    ``result`` column keeps the service's JSON as it came)."""
    code, summary, err = await run_cli(tmp_path, 300, _results_in("SUCCESS"), "--sink", "sqlite")
    assert code == 0, err[-600:]
    assert summary["tagged"] == 300
    db = sqlite3.connect(tmp_path / "out.jsonl")
    try:
        counts = dict(db.execute("SELECT status, count(*) FROM results GROUP BY status"))
        (word,) = db.execute(
            "SELECT json_extract(result, '$.status') FROM results LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    assert counts == {"success": 300}
    assert word == "SUCCESS"
