"""A base URL's basic-auth password masked in a write's answer (an echo may quote it) where the
answer is data the engine reads: a refused row's echoed id, a page's ids and descriptions.
Every server is real, on loopback."""

from __future__ import annotations

from pathlib import Path

import anyio

from fashiontag_pipeline.engine import RunSummary, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import TASKS_OF_1000, assert_exactly_once, client_config
from .proxy import MisbehavingProxy, Misbehaviour

N = 300
IDS = {f"fashion-{i}" for i in range(N)}


async def _run_behind_basic_auth(
    tmp_path: Path, misbehaviour: Misbehaviour
) -> tuple[Path, Path, RunSummary, int]:
    """``fashion-0`` .. ``fashion-299`` tagged through a gateway behind basic auth whose
    password is ``fashion`` (the proxy, misbehaving so): the results, rejects, summary and
    the rows the service took."""
    manifest = tmp_path / "m.csv"
    rows = [f"fashion-{i},https://img.example/{i}.jpg" for i in range(N)]
    manifest.write_text("id,url\n" + "\n".join(rows) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    proxy = MisbehavingProxy("", misbehaviour)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            url = proxy.url.replace("http://", "http://shop:fashion@")
            with anyio.fail_after(60):
                summary = await run_pipeline(
                    [manifest],
                    client=client_config(url),
                    out=out,
                    rejects=rej,
                    engine=TASKS_OF_1000,
                )
        sent = sum(len(record.ids) for record in svc.store.tasks.values())
    return out, rej, summary, sent


async def test_a_row_refused_whose_id_holds_the_base_url_password_is_rejected(
    tmp_path: Path,
) -> None:
    """A gateway behind basic auth (``http://shop:fashion@gw``) and ids that hold the password
    (``fashion-7``): the service refused that row, echoing its id in ``failureList``, and the
    answer had the password masked (``********-7``), so the refusal named no row of the
    write, the row counted as taken and was sent again (the task came up a row short). It
    is a reject at its first refusal; every other row is tagged."""
    out, rej, summary, _ = await _run_behind_basic_auth(
        tmp_path, Misbehaviour(always_refused={"fashion-7"})
    )
    o = assert_exactly_once(out, rej, IDS)
    assert [r["id"] for r in o.rejects] == ["fashion-7"], o.rejects
    assert summary.complete and summary.resent == 0


async def test_pages_spaced_before_their_json_keep_ids_that_hold_the_base_url_password(
    tmp_path: Path,
) -> None:
    """The same gateway (``http://shop:fashion@gw``) before a service whose every answer
    starts with a newline and spaces (a pretty-printer's, which JSON allows): a 2xx answer
    not starting with ``{`` was masked as a front end's page might be, so every results line
    of ``fashion-*`` came back as ``********-*``, ids no row was sent under: every row was
    sent, and billed, again and the run stopped. A 2xx JSON answer is the service's data
    whatever whitespace comes first; every row is tagged once."""
    out, rej, summary, sent = await _run_behind_basic_auth(
        tmp_path, Misbehaviour(leading_space=True)
    )
    o = assert_exactly_once(out, rej, IDS)
    assert o.rejects == [] and summary.complete and summary.resent == 0, summary
    assert sent == N
