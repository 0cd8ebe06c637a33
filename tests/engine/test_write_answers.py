"""Answers a real service may give that the reference service never does, each a way the
engine once lost a row or wrote one twice:

* a write applied but its answer lost, then the retry's duplicate failures worded another way
  (the spec leaves message texts open), or the retry refused whole with 400;
* a row the write's answer lists as refused, which the service took anyway and returns;
* a results page, or a poll (list, status), answered 200 with the spec's failure body;
* a create held in a slow service's queue past the client's deadline (or a gateway's: 504, 502,
  a dropped connection), applied later.

Each runs the reference service behind the misbehaving proxy (:mod:`.proxy`) and asserts every
id exactly once in the outputs, and that the run ends complete.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline import TaggerClient, Timeout
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import TASKS_OF_1000 as FAST
from .helpers import (
    assert_exactly_once,
    client_config,
    ids_of,
    read_outcomes,
    run_misbehaving,
    write_csv,
)
from .proxy import BULK, MisbehavingProxy, Misbehaviour, misbehaving

#: Tasks of 5,000 rows (a create then PUTs of 1,000), polled fast.
LONG_TASKS = EngineConfig(
    poll_min=0.02,
    poll_max=0.2,
    linger_seconds=0.2,
    fsync_seconds=10.0,
    rotate_images=5000,
    rotate_min_images=5000,
    read_again_window=3.0,  # (a row refused in a write of unknown fate: sent again 3 s after)
)


@pytest.mark.parametrize(
    "rules",
    [
        Misbehaviour(lose_first_put_answer=True, duplicate_wording="Duplicated image id:"),
        Misbehaviour(lose_first_put_answer=True, refuse_all_failed_with_400=True),
        Misbehaviour(lose_first_create_answer=True, duplicate_wording="context.id already exists:"),
        Misbehaviour(lose_first_create_answer=True, refuse_all_failed_with_400=True),
    ],
    ids=["put-reworded", "put-400", "create-reworded", "create-400"],
)
async def test_a_lost_write_answer_then_a_retry_refused_in_other_words(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """The service applies a write, its answer is lost, and the retry's rows fail as
    duplicates worded another way (or the retry is refused whole with 400). Those rows are in
    the task: each is tagged once, none rejected."""
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert proxy.lost_answers
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects


async def test_a_lost_create_answer_while_the_task_list_lags_leaves_one_task(
    tmp_path: Path,
) -> None:
    """The first create is applied and its answer lost, and the service's task list shows a
    new task only a second later. The engine does not take one look at the list as proof that
    nothing was created: it looks again before it creates the task a second time (the spec's
    promise: a retried create leaves no second live task, billed again for its rows)."""
    rules = Misbehaviour(lose_first_create_answer=True, list_lag=1.0)
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert proxy.lost_answers == ["create"]
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert len(proxy.created) == 1, proxy.created


async def test_a_create_answered_with_a_task_id_given_before_stops_the_run(
    tmp_path: Path,
) -> None:
    """Creates 2 to 4 are applied to task 1 and answered with task 1's id (a service that
    hands out an id twice, or merges creates). The engine took each answer as a new task,
    merged their state under one id, and, depending on timing, ended complete with exit 0
    with 1,000-2,000 ids lost and as many written twice. One task id cannot be read as two
    tasks: the run stops at the first such answer, its state saved, nothing written twice."""
    rules = Misbehaviour(merge_creates={2, 3, 4})
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(svc.url, rules) as proxy,
    ):
        with pytest.raises(FatalRunError, match=r"task id .* given to this run before"):
            await run_pipeline(
                [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=FAST
            )
    assert proxy.merged and set(proxy.merged) == {proxy.created[0]}
    o = read_outcomes(out, rej)
    ids = [r["id"] for r in o.results] + [r["id"] for r in o.rejects]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "rules",
    [Misbehaviour(drop_count_total=True), Misbehaviour(short_total=150)],
    ids=["no-total", "total-short"],
)
async def test_a_done_task_whose_result_count_is_missing_or_short_is_read_whole(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """A service that leaves ``count.total`` out of its task answers, or counts only some of
    its results there: the engine read no page past that count, sent the other rows again
    ``max_sends`` times and ended each as an ``unreturned`` reject, all billed five times,
    although the service held a result for every one. The rows written to the task tell how
    many results to read."""
    summary, _, o = await run_misbehaving(tmp_path, 3000, rules)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects
    assert summary.resent == 0


@pytest.mark.parametrize(
    "rules",
    [Misbehaviour(bom=True), Misbehaviour(http_date_times=True)],
    ids=["bom", "http-dates"],
)
async def test_answers_in_forms_json_and_times_allow(tmp_path: Path, rules: Misbehaviour) -> None:
    """A service whose JSON starts with a UTF-8 byte order mark (which a JSON reader may
    ignore), or which writes its times as HTTP dates: a page with a BOM was taken as garbled
    (its rows sent again, then ``unreturned`` rejects, or the run stopped), and an HTTP-date
    expiry crashed the run with a bare ``unrecognised time``. Both are read."""
    summary, _, o = await run_misbehaving(tmp_path, 2500, rules)
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 2500 and not o.rejects
    assert summary.resent == 0


async def test_creates_refused_with_5xx_for_ever_stop_the_run(tmp_path: Path) -> None:
    """Every create is answered 503 by a front end (nothing applied) while the task list
    answers. A 5xx to a write is of unknown fate: the task list is looked at, nothing found,
    the create sent again. The list's answers ended the failure streak each time, so the run
    never reached ``give_up_after`` and never ended; it stops, state saved."""
    engine = msgspec.structs.replace(FAST, give_up_after=2.0, list_lag=0.3)
    manifest = write_csv(tmp_path / "m.csv", 1500)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(svc.url, Misbehaviour(refuse_every_create=503)) as proxy,
    ):
        with anyio.fail_after(30), pytest.raises(FatalRunError, match="create task"):
            await run_pipeline(
                [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
            )
    assert proxy.writes_refused and set(proxy.writes_refused) == {503}


async def test_a_row_really_invalid_in_a_retried_write_ends_as_a_reject(tmp_path: Path) -> None:
    """As above (the first PUT's answer lost, duplicates worded otherwise), and p1500, in
    that PUT, is a row the service refuses every time. Its refusal in the retry is of unknown
    fate, so it is sent again, refused again by a write whose answer is certain, and ends as
    one ``server-validation`` reject; every other row is tagged."""
    rules = Misbehaviour(
        lose_first_put_answer=True,
        duplicate_wording="Duplicated image id:",
        always_refused={"p1500"},
    )
    summary, _, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p1500", "server-validation")]
    assert len(o.results) == 2999
    assert summary.resent == 1


async def test_a_row_refused_at_write_but_returned_has_one_outcome(tmp_path: Path) -> None:
    """The create's answer lists p0 as refused, yet the service took it and returns it; the
    last page leaves p999 out once. p0 keeps its reject alone (its result is left out), p999
    is read by the request for the rest of the short page (not sent again): every id once,
    and the run ends complete."""
    rules = Misbehaviour(refused_but_taken={"p0"}, left_out_once={"p999"})
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.2, linger_seconds=0.2, rotate_images=1000, rotate_min_images=1000
    )
    summary, _, o = await run_misbehaving(tmp_path, 1000, rules, engine)
    assert summary.complete and summary.unsettled == 0
    assert [r["id"] for r in o.rejects] == ["p0"]
    assert o.rejects[0]["stage"] == "server-validation"
    assert len(o.results) == 999
    assert summary.resent == 0


async def test_a_results_page_answered_200_with_a_failure_body_is_asked_again(
    tmp_path: Path,
) -> None:
    """Every results page is first answered 200 ``{"status":"failure",...}``: no page, and
    its rows not lost: the page is asked for again and every row tagged."""
    rules = Misbehaviour(failure_status_first_read=True)
    summary, proxy, o = await run_misbehaving(tmp_path, 2500, rules, LONG_TASKS)
    assert proxy.failure_pages >= 25
    assert summary.complete and len(o.results) == 2500 and not o.rejects
    assert summary.resent == 0


async def test_polls_answered_200_with_a_failure_body_are_asked_again(tmp_path: Path) -> None:
    """The first polls (list and status) are answered 200 ``{"status":"failure",...}``: a
    transient fault of the service, asked again; the run does not stop on it."""
    rules = Misbehaviour(failure_status_polls=4)
    summary, proxy, o = await run_misbehaving(tmp_path, 2500, rules, LONG_TASKS)
    assert proxy.failure_polls == 4
    assert summary.complete and len(o.results) == 2500 and not o.rejects


@pytest.mark.parametrize(
    "rules",
    [
        Misbehaviour(refuse_first_write={"POST": 408}),
        Misbehaviour(refuse_first_write={"PUT": 400}),
        Misbehaviour(refuse_first_write={"PUT": 409}),
        Misbehaviour(refuse_first_write={"PUT": 413}),
    ],
    ids=["create-408", "put-400", "put-409", "put-413"],
)
async def test_a_write_refused_whole_once_is_not_the_rows_outcome(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """One write answered with a whole-request status and an HTML page, nothing applied: a
    408 is a fault to wait out, and a PUT refused whole means the task takes no more writes.
    Either way its rows are sent again (to a new task) and tagged; none is rejected."""
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert proxy.writes_refused == list(rules.refuse_first_write.values())
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects


async def test_writes_over_a_front_proxys_body_limit_are_split_until_they_fit(
    tmp_path: Path,
) -> None:
    """A front proxy refuses bodies over 40 kB with 413 (a chunk of 1,000 rows is ~90 kB):
    the chunks are split until they fit, and every row is tagged."""
    rules = Misbehaviour(max_body_bytes=40_000)
    summary, proxy, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert 413 in proxy.writes_refused
    assert summary.complete and summary.unsettled == 0
    assert len(o.results) == 3000 and not o.rejects


async def test_a_write_refused_whole_for_one_row_rejects_that_row_alone(tmp_path: Path) -> None:
    """Every write carrying p1234 is refused whole with 400 and no failureList: the chunk is
    split until the one row is found, which ends as a ``server-validation`` reject with the
    service's answer; every other row is tagged."""
    rules = Misbehaviour(refuse_whole_with={"p1234"})
    summary, _, o = await run_misbehaving(tmp_path, 3000, rules, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p1234", "server-validation")]
    assert "HTTP 400" in o.rejects[0]["reason"]
    assert len(o.results) == 2999


async def test_polls_answered_408_are_asked_again(tmp_path: Path) -> None:
    """A front end answers the first polls 408 (it gave up waiting): a transient fault, asked
    again under the give-up budget; the run does not stop on it."""
    rules = Misbehaviour(polls_timed_out=6)
    summary, proxy, o = await run_misbehaving(tmp_path, 2500, rules, LONG_TASKS)
    assert proxy.polls_timed_out == 6
    assert summary.complete and len(o.results) == 2500 and not o.rejects


async def test_a_front_end_that_refuses_every_write_stops_the_run_not_every_row(
    tmp_path: Path,
) -> None:
    """A body limit smaller than any one row (or a firewall that answers 400 to every
    write): splitting finds no write the service takes, so the refusal is about no row. The
    run stops (state saved) after a chunk's worth of halvings, instead of some 2 requests
    per row and every row a reject of the front end's HTML page, "complete"."""
    rules = Misbehaviour(max_body_bytes=50)
    with pytest.raises(FatalRunError, match="refuses every write"):
        await run_misbehaving(tmp_path, 2000, rules, LONG_TASKS)
    assert not (tmp_path / "rej.jsonl").exists() or not (tmp_path / "rej.jsonl").read_text()


async def test_a_row_refused_whole_before_any_write_was_taken_is_still_its_reject(
    tmp_path: Path,
) -> None:
    """The manifest's first row is one the service refuses whole (400, unnamed), and its
    chunk is the run's only one: the split reaches it before any write was taken, so it
    waits; its neighbour is taken, which says the refusal is about the row: a reject, and
    every other row tagged (not a stop)."""
    rules = Misbehaviour(refuse_whole_with={"p0"})
    summary, _, o = await run_misbehaving(tmp_path, 1000, rules, LONG_TASKS)
    assert summary.complete and summary.unsettled == 0
    assert [(r["id"], r["stage"]) for r in o.rejects] == [("p0", "server-validation")]
    assert len(o.results) == 999


@pytest.mark.parametrize(
    "rules",
    [
        Misbehaviour(lose_first_put_answer=True, duplicate_wording="Duplicated image id:"),
        Misbehaviour(lose_first_put_answer=True, refuse_all_failed_with_400=True),
        Misbehaviour(lose_first_create_answer=True, refuse_all_failed_with_400=True),
        Misbehaviour(lose_first_put_answer=True, no_content_writes={"PUT"}),
    ],
    ids=["put-reworded", "put-400", "create-400", "put-204"],
)
async def test_rows_of_a_write_whose_answer_was_lost_count_as_submitted(
    tmp_path: Path, rules: Misbehaviour, state_location: Callable[[str], Path | str]
) -> None:
    """A write applied, its answer lost, and its retry refused in words of the service's own
    (or whole, with 400): the chunk is settled from the task's results. Its rows the task
    returned were billed, yet the summary said ``submitted 2,000`` of 3,000 rows all tagged
    (the service took 3,000). They count as submitted once, when the task returns them; the
    figures match the outputs and the bill."""
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        summary = await run_pipeline(
            [manifest],
            client=client_config(proxy.url),
            out=out,
            rejects=rej,
            state=state_location("run"),
            engine=LONG_TASKS,
        )
        billed = svc.store.image_count
    o = read_outcomes(out, rej)
    assert proxy.lost_answers and summary.complete
    assert (summary.tagged + summary.failed, summary.rejected) == (len(o.results), len(o.rejects))
    assert (summary.submitted, billed, len(o.results)) == (n, n, n)


async def test_each_task_holds_only_its_own_refused_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the service refuses (ids past its 1,024 characters) in every task: reading a task
    with refused rows read every refused id of the run into memory (and settling one too),
    so a run where the service refuses most rows held them all, once per task (20,000 such
    rows: 110 MB peak RSS, 2.3 s; 60,000: 162 MB, 12.1 s). A task holds its own alone."""
    from fashiontag_pipeline.engine.state import journal

    held: list[int] = []
    refused_ids = journal.Journal.refused_ids

    def recording(self: journal.Journal, *args: object, **kwargs: object) -> set[str]:
        out = refused_ids(self, *args, **kwargs)  # type: ignore[arg-type]
        held.append(len(out))
        return out

    monkeypatch.setattr(journal.Journal, "refused_ids", recording)
    tasks, per_task, refused = 8, 50, 40  # of each task's rows, ``refused`` are refused
    rows = [
        f"p{i}" + ("x" * 1100 if i % per_task < refused else "") for i in range(tasks * per_task)
    ]
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "id,url\n" + "".join(f"{r},https://x/{i}.jpg\n" for i, r in enumerate(rows))
    )
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.2, linger_seconds=0.2, rotate_images=50, rotate_min_images=50
    )
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [manifest], client=client_config(svc.url), out=out, rejects=rej, engine=engine
        )
    assert summary.complete
    o = read_outcomes(out, rej)
    assert len(o.results) == tasks * (per_task - refused)
    assert len(o.rejects) == tasks * refused
    assert {r["stage"] for r in o.rejects} == {"server-validation"}
    assert held and max(held) <= per_task, held


class LateCreate(MisbehavingProxy):
    """The proxy with a service slow to take writes: the first create waits ``delay`` seconds
    in its queue (longer than the client's deadline) before the service applies it."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__(upstream, Misbehaviour())
        self.delay = delay
        self.held = 0
        self.applied = anyio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.held:
            self.held += 1
            await request.read()  # (then held: the client's deadline passes meanwhile)
            await anyio.sleep(self.delay)
            try:
                return await super().handle(request)
            finally:
                self.applied.set()
        return await super().handle(request)


async def test_a_create_timed_out_and_applied_late_is_not_created_again(tmp_path: Path) -> None:
    """A service that answers slowly, near the client's deadline: a create held 3 s (deadline
    1.5 s) timed out, its task looked for in the list for ``list_lag`` (1 s), not found (the
    service had not got to it yet), and its chunk created again; the first create was then
    applied: two tasks of the same 1,000 rows, each row billed twice, one task never read. A
    create that timed out is looked for as long again as it went unanswered (the service may
    still be at work on it) before its rows are sent again."""
    proxy = LateCreate("", 3.0)
    engine = msgspec.structs.replace(FAST, list_lag=1.0, give_up_after=30.0)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(proxy.url, timeout=Timeout(total=1.5)),
                    out=out,
                    rejects=rej,
                    engine=engine,
                )
                await proxy.applied.wait()
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(1000))
    assert len(proxy.created) == 1, f"{len(proxy.created)} tasks hold the rows"


class GatewayTimeout(MisbehavingProxy):
    """The proxy as a gateway with a ``gateway`` seconds timeout in front of a service slow to
    take writes: the first create is answered 504 after ``gateway`` s, and the service it was
    handed to applies it ``delay`` s after it came."""

    def __init__(self, upstream: str, gateway: float, delay: float, status: int = 504) -> None:
        super().__init__(upstream, Misbehaviour())
        self.gateway, self.delay, self.status = gateway, delay, status
        self.held = 0
        self.applied = anyio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.held:
            self.held += 1
            body = await request.read()
            self.create_later(request, body, self.delay, self.applied)
            await anyio.sleep(self.gateway)
            if not self.status:  # (a gateway that drops the connection at its timeout)
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError("dropped at the gateway's timeout")
            return web.Response(status=self.status, body=b"<html><title>Gateway</title>")
        return await super().handle(request)


@pytest.mark.parametrize("status", [504, 502, 0], ids=["504", "502", "dropped"])
async def test_a_create_a_gateway_gave_up_on_and_applied_late_is_not_created_again(
    tmp_path: Path, status: int
) -> None:
    """The same behind a gateway that gives up first: the create answered 504 after 1.5 s
    (the service behind it still at work), or 502 (a cloud load balancer's backend timeout;
    503, 524 elsewhere), or its connection dropped at the gateway's timeout. It was looked for
    for ``list_lag`` only and created again, the first applied 1.5 s later: two tasks of the
    same rows. A create whose answer was lost after going unanswered so long is looked for as
    long again, whatever ended its wait, as one that timed out."""
    proxy = GatewayTimeout("", 1.5, 3.0, status)
    engine = msgspec.structs.replace(FAST, list_lag=1.0, give_up_after=30.0)
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
                )
                await proxy.applied.wait()
        async with TaggerClient(config=client_config(svc.url)) as client:
            tasks = await client.all_tasks()
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(1000))
    assert len(tasks) == 1, f"{len(tasks)} tasks hold the rows"
