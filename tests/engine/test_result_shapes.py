"""Answers whose shape the spec leaves open, on the paths that met them badly (found by a hunt).

* A tagging result the typed model does not take (a failure whose ``error.code`` is a word)
  is written by the JSONL sink as it came; the SQLite sink decoded it into the model to fill
  its columns and stopped the run, at every resume, so the run could never finish. A failure
  code past 64 bits did the same at the SQLite insert (OverflowError).
* A single endpoint answered 404 (a gateway that does not route ``/tagger/v2/tags``) made
  every local-file and ``data:`` row a ``server-validation`` reject, and the run ended
  complete: no row was ever tagged. A 404 is about no image; the run stops, its rows kept.
* ``fashiontag tag`` decoded the single endpoint's answer into the typed model after ``run``
  stopped doing so: an answer ``run`` writes as it came was exit 1, nothing printed.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline import BulkContext, Image, ImageType, TaggerClient, TaggingRequest
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, client_config, read_outcomes, write_csv
from .proxy import MisbehavingProxy, Misbehaviour, misbehaving
from .test_single_mode import red_picture, write_csv_rows

#: (A row without a tagging result object is sent again 3 s after its task is done, not 30.)
FAST = EngineConfig(
    poll_min=0.02, poll_max=0.2, linger_seconds=0.2, fsync_seconds=10.0, read_again_window=3.0
)

#: A per-image failure that names its cause in words (the spec's codes are numbers).
WORDED_FAILURE = {
    "status": "failure",
    "error": {"code": "IMAGE_DOWNLOAD_FAILED", "message": "image could not be fetched"},
}


#: A result with no status at all (found by the kill -9 fuzz): the pages read its status as
#: "", and the SQLite sink's status column takes no NULL.
NO_STATUS = {"error": {"code": 3001, "message": "image could not be fetched"}}

#: A failure whose code is past SQLite's 64-bit integers (a service that numbers its errors
#: with a hash, or a UUID as a number): the SQLite sink raised OverflowError writing its page.
HUGE_CODE = {"status": "failure", "error": {"code": 2**70 + 1, "message": "x"}}
#: A result whose status is a number (a service that numbers its statuses): a failure, as any
#: status but ``success`` (it was left out as no result, its row sent again every time).
NUMBERED = {"status": 1, "data": {"objects": []}}
#: The same past int64 yet within uint64 (what the typed model takes).
UINT64_CODE = {"status": "failure", "error": {"code": 2**64 - 1, "message": "x"}}


@pytest.mark.parametrize(
    ("sink", "given", "columns"),
    [
        ("jsonl", WORDED_FAILURE, None),
        ("sqlite", WORDED_FAILURE, ("failure", None, "IMAGE_DOWNLOAD_FAILED")),
        ("jsonl", NO_STATUS, None),
        ("sqlite", NO_STATUS, ("", None, 3001)),
        ("jsonl", HUGE_CODE, None),
        ("sqlite", HUGE_CODE, ("failure", None, None)),
        ("sqlite", UINT64_CODE, ("failure", None, None)),
        ("jsonl", NUMBERED, None),
        ("sqlite", NUMBERED, ("", None, None)),
    ],
)
async def test_a_result_of_another_shape_is_written_by_every_sink(
    tmp_path: Path, sink: str, given: dict[str, object], columns: tuple[object, ...] | None
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 20)
    out, rej = tmp_path / f"out.{sink}", tmp_path / "rej.jsonl"
    rules = Misbehaviour(results_given={"p3": given})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest],
            client=client_config(proxy.url),
            out=out,
            rejects=rej,
            engine=msgspec.structs.replace(FAST, sink=sink),
        )
    assert summary.complete
    if sink == "jsonl":
        results = {r["id"]: r["taggingResult"] for r in read_outcomes(out, rej).results}
        assert len(results) == 20 and results["p3"] == given
        return
    with sqlite3.connect(out) as db:
        assert db.execute("SELECT count(*) FROM results").fetchone() == (20,)
        row = db.execute(
            "SELECT status, category, error_code, result FROM results WHERE id='p3'"
        ).fetchone()
    assert row[:3] == columns
    assert msgspec.json.decode(row[3]) == given


class _Spliced(MisbehavingProxy):
    """The misbehaving proxy whose answers have ``"zz": "SPLICE"`` (a placeholder field of a
    result given) replaced by ``splice``: JSON no ``json.dumps`` writes."""

    def __init__(self, rules: Misbehaviour, splice: bytes) -> None:
        super().__init__("", rules)
        self.splice = splice

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        return out.replace(b'"zz": "SPLICE"', self.splice)


#: A failure whose ``status`` is repeated, ``success`` the second time (msgspec reads the last).
REPEATED_STATUS = {"status": "failure", "error": {"code": 803, "message": "x"}, "zz": "SPLICE"}
#: A failure whose error code is a word and which holds a number past a float's range in its
#: error: msgspec refuses the error, and the status with it.
HUGE_FLOAT = {"status": "failure", "error": {"code": "E", "zz": "SPLICE"}}


@pytest.mark.parametrize(
    ("given", "splice", "columns"),
    [
        (REPEATED_STATUS, b'"status": "success"', ("failure", None, 803)),
        (HUGE_FLOAT, b'"at": 1e400', ("failure", None, "E")),
    ],
    ids=["repeated-status", "huge-float"],
)
async def test_the_sqlite_status_column_says_what_the_summary_counted(
    tmp_path: Path, given: dict[str, object], splice: bytes, columns: tuple[object, ...]
) -> None:
    """A result msgspec reads otherwise than the pages do (a repeated key whose last value it
    takes, a number it refuses): its status column said ``success`` (or ``""``) where the
    summary counted it failed, so ``WHERE status = 'success'`` disagreed with ``tagged``."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out, rej = tmp_path / "out.db", tmp_path / "rej.jsonl"
    proxy = _Spliced(Misbehaviour(results_given={"p3": given}), splice)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            summary = await run_pipeline(
                [manifest],
                client=client_config(proxy.url),
                out=out,
                rejects=rej,
                engine=msgspec.structs.replace(FAST, sink="sqlite"),
            )
    assert summary.complete and summary.tagged + summary.failed == 20
    with sqlite3.connect(out) as db:
        (tagged,) = db.execute("SELECT count(*) FROM results WHERE status='success'").fetchone()
        row = db.execute(
            "SELECT status, category, error_code FROM results WHERE id='p3'"
        ).fetchone()
    assert tagged == summary.tagged
    assert row == columns


def _tagged(tag: dict[str, object], **data: object) -> dict[str, object]:
    """A success whose one object has one tag, ``tag`` (and ``data``'s other fields)."""
    return {"status": "success", "data": {"objects": [{"type": "CLOTHING", "tags": [tag]}], **data}}


_TOPS = {"id": "1", "name": "Tops"}
_TEE = {"id": "2", "name": "T-shirt", "confidence": 0.91}


@pytest.mark.parametrize(
    ("given", "columns"),
    [
        # A Go service's empty slices are null.
        (_tagged({"category": _TOPS, "item": _TEE, "colors": None}, imageinfo=None), (0.91,)),
        # An id as a number (a service numbering its categories).
        (_tagged({"category": {"id": 1, "name": "Tops"}, "item": _TEE}), (0.91,)),
        # A confidence as text: the names are still read.
        (_tagged({"category": _TOPS, "item": {**_TEE, "confidence": "0.91"}}), (None,)),
        # A field of its own of a type the model names otherwise.
        (_tagged({"category": _TOPS, "item": _TEE, "pairIndex": "left"}), (0.91,)),
    ],
    ids=["null-arrays", "number-id", "text-confidence", "other-type"],
)
async def test_the_sqlite_category_and_item_are_read_from_a_result_of_another_shape(
    tmp_path: Path, given: dict[str, object], columns: tuple[object, ...]
) -> None:
    """A success the typed model does not take in some field beside them (``null`` for an
    empty array, an id as a number): its category and item columns were NULL though its JSON
    names them, for every row of such a service (``GROUP BY category`` counted NULLs)."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    out, rej = tmp_path / "out.db", tmp_path / "rej.jsonl"
    rules = Misbehaviour(results_given={"p3": given})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest],
            client=client_config(proxy.url),
            out=out,
            rejects=rej,
            engine=msgspec.structs.replace(FAST, sink="sqlite"),
        )
    assert summary.complete and summary.tagged == 5
    with sqlite3.connect(out) as db:
        row = db.execute(
            "SELECT status, category, item, item_confidence FROM results WHERE id='p3'"
        ).fetchone()
    assert row == ("success", "Tops", "T-shirt", *columns)


@pytest.mark.parametrize(("given", "shown"), [("tagged", '"tagged"'), ([1], "[1]")])
async def test_a_row_whose_result_is_never_an_object_is_rejected_saying_so(
    tmp_path: Path, given: object, shown: str
) -> None:
    """A row the service answers every time with a tagging result that is no object: sent
    ``max_sends`` times, it was written as a reject saying it was "never returned" by the
    service, which had returned it each time: whoever read the rejects asked the service's
    owners about rows it lost. The reason says what came. And it was sent (and billed) five
    times for an answer that came the same each time: a row answered so on its second send
    is rejected then (one send again cures a page garbled once)."""
    manifest = write_csv(tmp_path / "m.csv", 20)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    rules = Misbehaviour(results_given={"p3": given})
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        with anyio.fail_after(120):
            summary = await run_pipeline(
                [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=FAST
            )
        assert svc.store.image_count == 21  # p3 sent twice, not max_sends (5) times
    assert summary.complete and summary.tagged == 19 and summary.rejected == 1
    assert summary.resent == 1
    (reject,) = read_outcomes(out, rej).rejects
    assert "sent to the service 2 times" in reject["reason"]
    assert reject["id"] == "p3" and reject["stage"] == "unreturned"
    assert "never returned" not in reject["reason"]
    assert "no tagging result object" in reject["reason"] and shown in reject["reason"]


async def test_a_single_endpoint_that_is_not_there_stops_the_run_and_rejects_no_row(
    tmp_path: Path,
) -> None:
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(5)] + [("h0", "https://img.example/0.jpg")]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state"
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(refuse_single=404)) as proxy:
            with pytest.raises(FatalRunError, match="HTTP 404, which is about no image"):
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=FAST,
                )
        assert not read_outcomes(out, rej).rejects
        # The endpoint routed again: the same command tags the rows that waited.
        summary = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            state=state,
            engine=FAST,
        )
    assert summary.complete
    o = read_outcomes(out, rej)
    assert sorted(o.ids) == sorted(i for i, _ in rows) and not o.rejects


#: A single-mode success carrying what the typed model lacks: a field of its own and a
#: ``pairIndex`` that is a number (the spec's type) but not an integer.
RICHER_SUCCESS = {
    "status": "success",
    "data": {
        "objects": [{"type": "SHOES", "tags": [{"pairIndex": 12.5, "heelColor": "red"}]}],
        "modelVersion": "7.1",
    },
}


@pytest.mark.parametrize(("given", "tagged"), [(WORDED_FAILURE, 0), (RICHER_SUCCESS, 1)])
async def test_a_single_mode_answer_of_another_shape_is_the_row_s_result_as_it_came(
    tmp_path: Path, given: dict[str, object], tagged: int
) -> None:
    """The single endpoint answers 200 with a tagging result the typed model does not take (a
    failure whose ``error.code`` is a word; a success with a field of its own, a fractional
    ``pairIndex``): bulk writes such a result as it came. Single mode decoded it into the
    model: a word code was an unreadable answer, the image sent (and billed) again until the
    run stopped, no row tagged; a field the model lacks was dropped from the output."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(3)] + [("h0", "https://img.example/0.jpg")]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, give_up_after=2.0)
    rules = Misbehaviour(single_given=given)
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
        )
    assert summary.complete and summary.single == 3 and summary.rejected == 0
    assert proxy.single_given_sent == 3  # each image sent (and billed) once
    results = {r["id"]: r["taggingResult"] for r in read_outcomes(out, rej).results}
    assert all(results[f"s{i}"] == given for i in range(3))
    assert summary.tagged == 1 + 3 * tagged and summary.failed == 3 * (1 - tagged)


@pytest.mark.parametrize(("given", "code"), [(WORDED_FAILURE, 1), (RICHER_SUCCESS, 0)])
async def test_fashiontag_tag_prints_an_answer_of_another_shape_as_it_came(
    given: dict[str, object], code: int
) -> None:
    """``fashiontag tag`` decoded the answer into the typed model, as single mode in ``run``
    did: the answer ``run`` writes as it came was an error there (``HTTP 200 body is not the
    expected JSON``, exit 1 with no answer printed), and a field the model lacks would be
    dropped from what it prints. It prints the answer as the service sent it; the exit code
    and the reason still come from its ``status`` and ``error``."""
    rules = Misbehaviour(single_given=given)
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        argv = ["tag", "https://img.example/0.jpg", "--base-url", proxy.url]
        argv += ["--give-up-after", "2"]
        done = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *argv], check=False, env=ENV
        )
    assert done.returncode == code, done.stderr.decode()
    assert msgspec.json.decode(done.stdout) == given
    assert proxy.single_given_sent == 1
    if code:
        assert "(code IMAGE_DOWNLOAD_FAILED: image could not be fetched)" in done.stderr.decode()


async def test_a_single_mode_refusal_in_the_bulk_paths_shape_is_no_result(tmp_path: Path) -> None:
    """A gateway (or the service) answering the single endpoint HTTP 200 with the error body
    of the bulk paths, ``{"status": "failure", "error": "<message>"}`` (a quota, a rate limit
    worded so; DESIGN's single error body has an ``error`` object), refused the request, not
    the image. Taken as a tagging result, every row was written as a failure and the run
    ended complete, exit 0, its rows never tagged and never sent again on a resume. It is a
    fault of the service, retried under the run's budget: the run stops, the rows wait."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(3)]
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state"
    engine = msgspec.structs.replace(FAST, give_up_after=1.0)
    refusal = {"status": "failure", "error": "quota exceeded for this key"}
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(single_given=refusal)) as proxy:
            with pytest.raises(FatalRunError, match="quota exceeded for this key"):
                await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=engine,
                )
        o = read_outcomes(out, rej)
        assert not o.results and not o.rejects
        again = client_config(svc.url)
        summary = await run_pipeline(
            [manifest], client=again, out=out, rejects=rej, state=state, engine=FAST
        )
    assert summary.complete and summary.tagged == 3 and summary.failed == 0


async def test_tasks_results_prints_every_result_as_it_came() -> None:
    """``fashiontag tasks results``, how a support engineer recovers a failed night's rows by
    hand, decoded the page into the typed model: a page holding a result ``run`` writes as it
    came (a failure whose ``error.code`` is a word) was exit 1, ``response is not a results
    page``, none of its 100 results printed; a field the model lacks (``modelVersion``, a
    fractional ``pairIndex``) was dropped from what it printed. It prints the page as sent."""
    given = {"p1": WORDED_FAILURE, "p2": RICHER_SUCCESS, "p3": NO_STATUS}
    rules = Misbehaviour(results_given=given)
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        async with TaggerClient(config=client_config(svc.url)) as client:
            requests = [
                TaggingRequest(
                    image=Image(type=ImageType.URL, content=f"https://img.example/{i}.jpg"),
                    context=BulkContext(id=f"p{i}"),
                )
                for i in range(5)
            ]
            created = await client.create_task(requests, description="night")
            with anyio.fail_after(10):
                while not (await client.task_status(created.task_id)).done:
                    await anyio.sleep(0.02)
        argv = ["tasks", "results", created.task_id, "--base-url", proxy.url]
        done = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *argv, "--give-up-after", "2"],
            check=False,
            env=ENV,
        )
    assert done.returncode == 0, done.stderr.decode()
    page = msgspec.json.decode(done.stdout)
    assert page["taskInfo"]["totalCount"] == 5
    results = {r["id"]: r["taggingResult"] for r in page["results"]}
    assert set(results) == {f"p{i}" for i in range(5)}
    assert all(results[ident] == shape for ident, shape in given.items()), results
