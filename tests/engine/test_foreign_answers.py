"""A service whose answers do not line up with what was sent, in ways real services do.

Each test runs the reference service behind the misbehaving proxy (:mod:`.proxy`) and checks
every row ends once, none is billed again without need, and the run ends as it should. Found
by a hunt, each failing before its fix:

* **Ids changed on the way back** (whitespace stripped, Unicode NFC-normalised, case changed, ids
  cut to 64 characters, URLs percent-encoded or decoded): every result came under an id never sent
  to its task, was left out, and every row was sent (and billed) ``max_sends`` = 5 times, then
  written as an ``unreturned`` reject: 1,500 rows billed 7,500 times, no result, exit 0. A
  numeric-looking id echoed as a JSON number (``"id": 7`` for ``"7"`` or ``"007"``) made every page
  unreadable: the run stopped with exit 1 after ten pages, and every resume did the same.
* **A task state the spec does not name** (``task_done``, ``TASK_FAILED``, ``CANCELLED``),
  even on another team's task in the key's list, made the whole list unreadable: the run
  stopped with exit 1 after ``give_up_after`` and could never finish; the daemon polled for
  ever.
* **Pages that come short of new rows** (an order that changes between reads, a page answered
  with the one before it, a results store that lags the status): the rows missing were sent
  again at once, each billed twice (half of a 3,000-row run under a changing order; every row
  of the lagging half, five times over, then rejects).
* **Rows the service lost** (its count short of the rows written, pages past it refused with
  400): the pages past its count, read for the rows written, counted as unreadable, and ten of
  them stopped the run (exit 1) before the rows were sent again.
"""

from __future__ import annotations

import json
import unicodedata
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline.engine import EngineConfig, RunSummary, fetch, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import (
    TASKS_OF_1000,
    Outcomes,
    client_config,
    read_outcomes,
    run_misbehaving,
    write_csv,
)
from .proxy import MisbehavingProxy, Misbehaviour

#: Tasks of 3,000 rows (a create then PUTs of 1,000), polled fast.
LONG_TASKS = msgspec.structs.replace(TASKS_OF_1000, rotate_images=3000, rotate_min_images=3000)


class CountingProxy(MisbehavingProxy):
    """The misbehaving proxy that counts the rows written to the service (each one billed)."""

    def __init__(self, rules: Misbehaviour) -> None:
        super().__init__("", rules)
        self.written: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("POST", "PUT"):
            body = json.loads(await request.read() or b"{}")
            self.written.update(r["context"]["id"] for r in body.get("taggingRequest", []))
        return await super().handle(request)


async def run_ids(
    tmp_path: Path, ids: list[str], rules: Misbehaviour, engine: EngineConfig = TASKS_OF_1000
) -> tuple[RunSummary, CountingProxy, Outcomes]:
    """A run of a JSONL manifest of ``ids`` through the proxy; every id exactly once in the
    outputs is asserted."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"id": ident, "url": f"https://img.example/{n}.jpg"}) + "\n"
            for n, ident in enumerate(ids)
        )
    )
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = CountingProxy(rules)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
                )
    o = read_outcomes(out, rej)
    got = [r["id"] for r in o.results] + [r["id"] for r in o.rejects]
    assert sorted(got) == sorted(ids)
    return summary, proxy, o


def _number(ident: str) -> Any:
    return int(ident) if ident.isdigit() else ident


def _cut_utf16(ident: str) -> str:
    """``ident`` cut to 64 UTF-16 code units, as a Java, .NET or JavaScript service cuts a
    string: an emoji across the cut leaves its first half, a lone surrogate (``\\ud83d``)."""
    units = ident.encode("utf-16-le", "surrogatepass")[:128]
    return units.decode("utf-16-le", "surrogatepass")


ROBE = "robe \u00e9t\u00e9 "

#: name -> (the manifest's ids, what the service makes of each id it echoes)
CHANGES: dict[str, tuple[list[str], Callable[[str], Any]]] = {
    "stripped": ([f"  sku {i}\t" for i in range(1500)], str.strip),
    "nfc": ([f"cafe\u0301-{i}" for i in range(1500)], lambda s: unicodedata.normalize("NFC", s)),
    "upper-case": ([f"sku-{i}-ab" for i in range(1500)], str.upper),
    "lower-case": ([f"SKU-{i}" for i in range(1500)], str.lower),
    "cut-to-64": ([f"{i:06d}-" + "x" * 70 for i in range(1500)], lambda s: s[:64]),
    "cut-in-an-emoji": (
        [f"{i:06d}-" + "x" * 56 + "\U0001f600" * 4 for i in range(1500)],
        _cut_utf16,
    ),
    # Ids that are the images' URLs, echoed as a service that keeps them as URLs writes them:
    # spaces and accents percent-encoded (half of them hold none: those come back as sent).
    "percent-encoded": (
        [f"https://shop.example/p/{ROBE * (i % 2)}{i}.jpg" for i in range(1500)],
        lambda s: urllib.parse.quote(s, safe=":/"),
    ),
    "percent-decoded": (
        [f"https://shop.example/p/{'robe%20' * (i % 2)}{i}.jpg" for i in range(1500)],
        urllib.parse.unquote,
    ),
    "a-number": ([str(i) for i in range(1500)], _number),
    "zeros-dropped": ([f"{i:08d}" for i in range(1500)], _number),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_ids_the_service_changes_on_the_way_back(tmp_path: Path, change: str) -> None:
    """Every result comes under the id the service made of the one sent: each is the result
    of the one row sent to its task whose id it stands for, written under the manifest's own
    id; no row is sent twice."""
    ids, echo = CHANGES[change]
    summary, proxy, o = await run_ids(tmp_path, ids, Misbehaviour(echo_id=echo))
    assert summary.complete and summary.unsettled == 0
    assert not o.rejects
    assert summary.resent == 0 and summary.tagged == len(ids)
    assert sorted(proxy.written.elements()) == sorted(ids)  # each row billed once


async def test_an_id_the_service_changes_into_another_sent_id_is_never_taken_for_it(
    tmp_path: Path,
) -> None:
    """Ids that the service's change makes equal within a task (``a1`` and ``A1``, upper-cased
    both) cannot be told apart: each still ends once, and the run ends complete."""
    ids = [f"a{i}" for i in range(50)] + [f"A{i}" for i in range(50)]
    summary, _, o = await run_ids(
        tmp_path,
        ids,
        Misbehaviour(echo_id=str.upper),
        msgspec.structs.replace(TASKS_OF_1000, max_sends=2),
    )
    assert summary.complete and summary.unsettled == 0
    assert {r["stage"] for r in o.rejects} <= {"unreturned"}


@pytest.mark.parametrize(
    ("word", "ended"),
    [("task_done", False), ("Task-Done", False), ("TASK_FAILED", True), ("CANCELLED", True)],
)
async def test_a_task_state_the_spec_does_not_name(tmp_path: Path, word: str, ended: bool) -> None:
    """Task 1 is shown, once processed, in a state of the service's own: ``task_done`` is done
    (read, nothing sent again); a failed or cancelled task will never be done, but its pages
    are read before any of its rows is sent again: here they hold every row, so none is (each
    was sent, and billed, again). The list stays readable either way."""
    rules = Misbehaviour(status_when_done={1: word})
    with anyio.fail_after(60):
        summary, _, o = await run_misbehaving(tmp_path, 2000, rules)
    assert summary.complete and summary.unsettled == 0 and not o.rejects
    assert summary.resent == 0 and summary.lost_tasks == (1 if ended else 0)
    assert len(o.results) == 2000


@pytest.mark.parametrize(
    ("rules", "resent"),
    [
        # Processed 600 of its 1,000 rows; pages from there on refused with 400.
        (Misbehaviour(status_when_done={1: "TASK_FAILED"}, lose_rows={1: 400}), 400),
        # No page of it can be read (400): every row is sent again, at once.
        (Misbehaviour(status_when_done={1: "CANCELLED"}, refuse_page={1: 0}), 1000),
    ],
    ids=["part-processed", "pages-refused"],
)
async def test_a_failed_task_whose_pages_hold_some_rows(
    tmp_path: Path, rules: Misbehaviour, resent: int
) -> None:
    """A failed task's pages are read first, and only the rows without a result on them are
    sent again; a page refused falls back to sending the rest again, without the attempts and
    the grace a done task's page gets (nor counting towards the pages that stop a run). Before,
    every row of a failed task was sent (and billed) again."""
    with anyio.fail_after(30):
        summary, proxy, o = await run_misbehaving(tmp_path, 2000, rules)
    assert summary.complete and summary.unsettled == 0 and not o.rejects
    assert summary.resent == resent and summary.lost_tasks == 1
    assert len(o.results) == 2000
    assert proxy.refused_pages <= 4  # each page refused is asked for once


@pytest.mark.parametrize("word", ["CANCELLED", "TASK_FAILED", "task_processing"])
async def test_another_teams_task_in_a_state_the_spec_does_not_name(
    tmp_path: Path, word: str
) -> None:
    """The key's task list holds another team's task in a state the spec does not name: the
    list is read all the same (it was unreadable: the run stopped, every time)."""
    with anyio.fail_after(60):
        summary, _, o = await run_misbehaving(tmp_path, 2000, Misbehaviour(stranger_status=word))
    assert summary.complete and summary.resent == 0 and len(o.results) == 2000


async def test_pages_written_in_latin_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every results page comes in ISO-8859-1 (``café`` with the byte E9, no UTF-8): no
    page can be read, and the run stops as for any garbled page (exit 1, state saved, the
    rows not sent again for ever). Before, msgspec's UnicodeDecodeError (no DecodeError)
    escaped the page reader and the run ended on a traceback."""
    monkeypatch.setattr(fetch, "NOT_READY_GRACE", 1.0)  # (no page read: asked again meanwhile)
    ids = [f"caf\u00e9-{i}" for i in range(1000)]
    with pytest.raises(FatalRunError, match="garbled 10 results pages"):
        await run_ids(tmp_path, ids, Misbehaviour(latin1_ops={"results"}))


async def test_a_result_whose_status_is_written_in_latin_1(tmp_path: Path) -> None:
    """A page in ISO-8859-1 whose ids are ASCII reads (msgspec keeps each tagging result
    unread), and one result says ``"status": "\u00e9chec"`` (the byte E9) between other keys:
    its status was decoded on its own and msgspec's UnicodeDecodeError escaped the page
    reader, the run ending on a traceback at every resume. It is a status that is not
    ``success``: the row is a failed one, every other row tagged. (The results JSONL keeps
    the result's bytes as the service sent them.)"""
    failed = {"error": {"code": 803, "message": "image"}, "status": "\u00e9chec", "tags": []}
    ids = [f"p{i}" for i in range(1000)]
    rules = Misbehaviour(results_given={"p7": failed}, latin1_ops={"results"})
    out = tmp_path / "out.jsonl"
    proxy = CountingProxy(rules)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=tmp_path / "rej.jsonl",
                    engine=TASKS_OF_1000,
                )
    assert summary.complete and (summary.tagged, summary.failed) == (999, 1)
    assert set(proxy.written.values()) == {1}  # no row sent twice
    lines = out.read_bytes().splitlines()
    assert len(lines) == len(ids) and sum(b'"status": "\xe9chec"' in line for line in lines) == 1


async def test_a_page_answered_with_the_page_before_it(tmp_path: Path) -> None:
    """Every page past the first is answered, the first time, with the page before it (a
    stale cache): its rows come on a second read, none is sent again."""
    rules = Misbehaviour(repeat_previous_page_once=True)
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules)
    assert proxy.pages_repeated >= 27
    assert summary.complete and summary.resent == 0 and len(o.results) == 3000


async def test_a_page_answered_with_the_page_after_it(tmp_path: Path) -> None:
    """Every page is answered, the first time, with the page after it: the rows missing are
    the first page's, and the page that comes short is the last one. Reading again only the
    pages that came short found none of them: the first page of every task was sent again
    (billed twice). Every page of the task is read again once the short ones leave rows
    missing. (The full suite met the same with the page before it, whenever the pages were
    read in the order that makes a page's first read give new rows of another page.)"""
    rules = Misbehaviour(next_page_once=True)
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules)
    assert proxy.pages_shifted >= 30
    assert summary.complete and summary.resent == 0 and len(o.results) == 3000


async def test_a_results_store_that_lags_the_status(tmp_path: Path) -> None:
    """For a second after a task is shown done its pages hold only its first half (a results
    store that lags the status, answering short pages instead of refusing them): the rest are
    read again a moment later, not sent again (they were, five times each, then rejects)."""
    rules = Misbehaviour(lagging_results=1.0)
    summary, _, o = await run_misbehaving(tmp_path, 2000, rules)
    assert summary.complete and summary.resent == 0 and len(o.results) == 2000


async def test_pages_refused_for_a_moment_after_the_first_one_was_read(tmp_path: Path) -> None:
    """Each task's first page is answered, then its other pages are refused with 400 for 2 s
    (a results store readable part by part, a task back to processing for a moment: the spec
    shows no status code for "not ready"): they are asked for again, as those of a task none
    of whose pages was read are, and no row is sent again. Before, each was taken as empty
    after four answers in 0.7 s: 1,100 to 1,400 rows of 2,000 were sent (and billed) again."""
    rules = Misbehaviour(refuse_after_first_page=2.0)
    with anyio.fail_after(60):
        summary, proxy, o = await run_misbehaving(tmp_path, 2000, rules)
    assert proxy.refused_pages >= 8
    assert summary.complete and summary.resent == 0 and len(o.results) == 2000


async def test_rows_the_service_lost_and_pages_past_its_count_refused(tmp_path: Path) -> None:
    """The service lost the last 1,200 rows of a 3,000-row task: its count says 1,800, and
    pages from there on are refused with 400. Those pages are the end of its results, not
    pages to stop the run for: the lost rows are sent again, once, and the run ends complete."""
    rules = Misbehaviour(lose_rows={1: 1200})
    with anyio.fail_after(60):
        summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0 and not o.rejects
    assert summary.resent == 1200 and len(o.results) == 3000
    assert proxy.refused_pages >= 1


#: Another task's result (a marker no image of the reference service has).
STRAY = {"status": "success", "result": [], "stray": True}


@pytest.mark.parametrize(
    ("ids", "stray_id"),
    [
        # The other task's id, whole: the start of an id of this task.
        (["catalogue-item-000123-v2", "catalogue-item-000123"], "catalogue-item-000123"),
        # An id cut short that starts an id of this task and one of the other's.
        (["catalogue-item-000123-v2", "catalogue-item-000123-v3"], "catalogue-item-000123-v"),
    ],
    ids=["an-id-of-the-run", "the-start-of-two"],
)
async def test_another_tasks_result_under_the_start_of_an_id_sent(
    tmp_path: Path, ids: list[str], stray_id: str
) -> None:
    """Task 1's page gives, in place of the row of ``ids[0]``, a result under ``stray_id``
    (16 characters or more): the start of ``ids[0]``, the one id of task 1 it could be cut
    from, but also another task's id (``ids[1]``), or the start of one. It may be that other
    row's result, so it is taken as no row's: ``ids[0]`` gets its own when the page is read
    again (the service gives it there). Before, ``ids[0]`` got it, silently: the result of
    another image."""
    manifest_ids = [f"p{i}" for i in range(2000)]
    manifest_ids[10], manifest_ids[1500] = ids  # in tasks 1 and 2
    rules = Misbehaviour(stray_in_place_of={ids[0]: (stray_id, STRAY)})
    summary, _, o = await run_ids(tmp_path, manifest_ids, rules)
    assert summary.complete and summary.unsettled == 0 and not o.rejects
    assert not [r["id"] for r in o.results if r["taggingResult"].get("stray")]
    assert summary.resent == 0 and summary.tagged == 2000


#: id -> what the service echoes in its place: ids no client can read as text.
UNREADABLE_IDS: dict[str, Any] = {"p5": None, "p120": 7.0, "p250": {"value": "p250"}, "p260": True}


async def test_ids_echoed_as_null_a_float_or_an_object(tmp_path: Path) -> None:
    """Four rows come back under an id that is ``null``, a float, an object or ``true``, every
    time: each is a result under no id sent, its row sent again (``max_sends`` = 2) and then an
    ``unreturned`` reject; every other row of their pages is read, none sent again. Before,
    each page holding one was unreadable: asked for four times, taken as empty, its 100 rows
    sent again, and ten such pages stopped the run (exit 1)."""
    ids = [f"p{i}" for i in range(300)]
    summary, proxy, o = await run_ids(
        tmp_path,
        ids,
        Misbehaviour(echo_id=lambda s: UNREADABLE_IDS.get(s, s)),
        msgspec.structs.replace(TASKS_OF_1000, max_sends=2),
    )
    assert summary.complete and summary.unsettled == 0
    assert {r["id"]: r["stage"] for r in o.rejects} == dict.fromkeys(UNREADABLE_IDS, "unreturned")
    assert summary.resent == len(UNREADABLE_IDS) and summary.tagged == 296
    assert sorted(proxy.written.elements()) == sorted(ids + list(UNREADABLE_IDS))
