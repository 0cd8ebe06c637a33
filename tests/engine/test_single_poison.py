"""A single-mode image the service always fails on (a poison image) when no other image is
left to tag: its failures still count toward ``max_sends`` (across runs), once the single
endpoint has tagged another image of the run; an endpoint that has tagged none rejects none."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import msgspec
import pytest

from fashiontag_pipeline import RetryPolicy
from fashiontag_pipeline.engine import EngineConfig, RunSummary, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, read_outcomes
from .proxy import Misbehaviour, misbehaving
from .test_single_mode import red_picture, write_csv_rows

ENGINE = EngineConfig(
    poll_min=0.02, poll_max=0.1, linger_seconds=0.2, fsync_seconds=10.0, single_concurrency=1
)


async def _run(tmp_path: Path, csv: Path, url: str, engine: EngineConfig) -> RunSummary:
    """``csv`` through the service at ``url``, outputs and state in ``tmp_path``."""
    return await run_pipeline(
        [csv],
        client=client_config(url),
        out=tmp_path / "out.jsonl",
        rejects=tmp_path / "rej.jsonl",
        state=tmp_path / "state.db",
        engine=engine,
    )


@pytest.mark.parametrize("how", ["500", "dropped"])
async def test_a_poison_image_left_last_is_a_reject_not_a_stopped_run(
    tmp_path: Path, how: str
) -> None:
    """The poison image is the last single-mode row (sent one at a time, so every other image
    is tagged before it): with nothing else to tag between its failures, it was retried until
    ``give_up_after`` and the run stopped, exit 1, every resume the same. Now its failures
    count once the endpoint has tagged another image; the first run stops on it (one run
    cannot tell it from an outage), and the resume, failing on it again with ``max_sends`` of
    them counted, ends it as a reject of stage ``unreturned``: the run completes."""
    png = red_picture(tmp_path / "red.png")
    poison = red_picture(tmp_path / "poison.jpg")
    marker = base64.b64encode(poison.read_bytes())[-120:]
    rows = [(f"s{i}", str(png)) for i in range(5)] + [("bad", str(poison))]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(ENGINE, give_up_after=5.0)
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(
            svc.url, Misbehaviour(fail_single_holding=marker, drop_single=how == "dropped")
        ) as proxy,
    ):
        with pytest.raises(FatalRunError, match="single-mode tag"):
            await _run(tmp_path, csv, proxy.url, engine)
        assert read_outcomes(out, rej).rejects == []
        summary = await _run(tmp_path, csv, proxy.url, engine)
    assert summary.complete and summary.error is None
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    (reject,) = o.rejects
    assert reject["id"] == "bad" and reject["stage"] == "unreturned"
    assert "no other image left" in reject["reason"]
    times = re.search(r"failed on this image (\d+) times", reject["reason"])
    assert times is not None and int(times[1]) >= 5, reject["reason"]
    assert proxy.single_failed >= 5 * 4


async def test_a_poison_image_s_failures_add_up_across_resumes(tmp_path: Path) -> None:
    """Each run gives up on the poison image before ``max_sends`` failures (a short
    ``give_up_after``): its failures are kept in the state, so a later resume, with nothing
    else left to tag, ends it as a reject instead of stopping on it every night."""
    png = red_picture(tmp_path / "red.png")
    poison = red_picture(tmp_path / "poison.jpg")
    marker = base64.b64encode(poison.read_bytes())[-120:]
    rows = [(f"s{i}", str(png)) for i in range(3)] + [("bad", str(poison))]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state.db"
    engine = msgspec.structs.replace(ENGINE, give_up_after=0.3)
    stops = 0
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(svc.url, Misbehaviour(fail_single_holding=marker)) as proxy,
    ):
        config = msgspec.structs.replace(
            client_config(proxy.url), retry=RetryPolicy(max_attempts=1)
        )
        for _ in range(8):
            try:
                summary = await run_pipeline(
                    [csv], client=config, out=out, rejects=rej, state=state, engine=engine
                )
            except FatalRunError:
                stops += 1
                continue
            break
        else:
            pytest.fail(f"the poison image stopped every run ({proxy.single_failed} failures)")
    assert stops >= 1  # one run alone did not reach max_sends: the count went on
    assert summary.complete
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    (reject,) = o.rejects
    assert reject["id"] == "bad" and reject["stage"] == "unreturned"
    assert "no other image left" in reject["reason"]


async def test_a_lone_image_of_an_endpoint_that_tagged_none_is_no_reject(tmp_path: Path) -> None:
    """The only single-mode row, answered HTTP 500 while the endpoint has tagged no image of
    the run: no sign that the image and not the endpoint is at fault, so no reject; the run
    stops with the state saved, and a resume once the endpoint works tags it."""
    png = red_picture(tmp_path / "red.png")
    rows = [("s0", str(png))]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(ENGINE, give_up_after=1.0)
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(fail_single_holding=b"")) as proxy:
            with pytest.raises(FatalRunError, match="single-mode tag"):
                await _run(tmp_path, csv, proxy.url, engine)
        assert proxy.single_failed > 5
        assert read_outcomes(out, rej).rejects == []
        summary = await _run(tmp_path, csv, svc.url, engine)
    assert summary.complete and summary.rejected == 0
    assert_exactly_once(out, rej, {i for i, _ in rows})


async def test_an_outage_with_one_image_left_rejects_no_image(tmp_path: Path) -> None:
    """Five images tagged, then the single endpoint answers 500 to everything (an outage of a
    few minutes) while the last image is on its way: inside one run nothing tells that from
    a poison image, and the image was an ``unreturned`` reject once ``give_up_after`` was
    spent, the run complete, exit 0, a good picture never tagged. A lone image's failures
    end it only when they were counted in an earlier run too: this run stops, state saved,
    and the same command once the endpoint works tags it."""
    png = red_picture(tmp_path / "red.png")
    last = red_picture(tmp_path / "last.jpg")
    marker = base64.b64encode(last.read_bytes())[-120:]
    rows = [(f"s{i}", str(png)) for i in range(5)] + [("last", str(last))]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(ENGINE, give_up_after=3.0)
    async with running_service(ServiceConfig()) as svc:
        async with misbehaving(svc.url, Misbehaviour(fail_single_holding=marker)) as proxy:
            with pytest.raises(FatalRunError, match="single-mode tag"):
                await _run(tmp_path, csv, proxy.url, engine)
        assert proxy.single_failed >= 5  # (max_sends counted: before, a reject here)
        assert read_outcomes(out, rej).rejects == []
        summary = await _run(tmp_path, csv, svc.url, engine)
    assert summary.complete and summary.rejected == 0
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    assert len(o.results) == 6
