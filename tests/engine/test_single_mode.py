"""Single-mode routing: local files and data: URIs go to the single endpoint (base64), against
the reference service over loopback (it decodes the real pixels sent)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline import RetryPolicy, TaggerClient
from fashiontag_pipeline._models import Context
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.flow import FatalRunError
from fashiontag_pipeline.engine.single import SingleRejected, load_image
from fashiontag_pipeline.engine.source import open_manifest
from fashiontag_pipeline.engine.validate import SINGLE_FILE, SingleRequest, Validator
from fashiontag_pipeline.service import FaultSpec, ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, read_outcomes
from .proxy import Misbehaviour, misbehaving
from .test_resume_trickle import ENV, run_args

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2, fsync_seconds=10.0)


def red_picture(path: Path) -> Path:
    """A red rectangle on white (PNG or JPEG from the suffix)."""
    canvas = PILImage.new("RGB", (240, 320), (250, 250, 250))
    canvas.paste((200, 20, 30), (60, 60, 180, 280))
    canvas.save(path)
    return path


def data_uri(path: Path, ext: str = "png") -> str:
    return f"data:image/{ext};base64," + base64.b64encode(path.read_bytes()).decode()


def colors_of(result: dict[str, Any]) -> list[str]:
    data = result["taggingResult"].get("data") or {}
    return [
        c["name"]
        for obj in data.get("objects", [])
        for tag in obj["tags"]
        for c in tag.get("colors", [])
    ]


def write_csv_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    lines = ["id,url,brand,age"] + [f'{i},"{u}",acme,20s|30s' for i, u in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- routing rules


def test_route_rules_without_a_service(tmp_path: Path) -> None:
    """Which rows go where, and the client-side reasons of the ones that cannot go anywhere."""
    p = tmp_path / "m.jsonl"
    rows = [
        {"id": "h", "url": "https://x/1.jpg"},
        {"id": "rel", "url": "imgs/a.png", "age": ["20s", "30s"], "detection": ["TOP"]},
        {"id": "abs", "url": "/data/a.png"},
        {"id": "fu", "url": "file:///data/b%20c.png"},
        {"id": "fl", "image": {"type": "url", "content": "file://localhost/data/d.png"}},
        {"id": "du", "url": "data:image/png;base64,AAAA"},
        {"id": "b64", "image": {"type": "base64", "content": "data:image/jpeg;base64,AAAA"}},
        {"id": "x1", "url": "ftp://x/1.jpg"},
        {"id": "x2", "url": "file://otherhost/a.png"},
        {"id": "x3", "url": "data:text/plain;base64,AAAA"},
        {"id": "x4", "image": {"type": "base64", "content": "AAAA"}},
        {"id": "x5", "image": {"type": "path", "content": "a.png"}},
        {"id": "w1", "url": "C:\\images\\a.png"},
        {"id": "w2", "url": "d:/images/a.png"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reader = open_manifest(str(p), 0)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None
    items, singles, rejects = Validator(cwd="/work/dir").route(batch)
    assert [i[0] for i in items] == ["h"]
    routed = {ident: request for ident, _, request in singles}
    assert {k: (r.kind, r.content) for k, r in routed.items()} == {
        "rel": ("file", "/work/dir/imgs/a.png"),
        "abs": ("file", "/data/a.png"),
        "fu": ("file", "/data/b c.png"),
        "fl": ("file", "/data/d.png"),
        "du": ("data", "data:image/png;base64,AAAA"),
        "b64": ("data", "data:image/jpeg;base64,AAAA"),
    }
    assert routed["rel"].context.age == "20s,30s" and routed["rel"].context.detection == ["TOP"]
    assert routed["rel"].context.id == "rel" and routed["rel"].line == 2
    reasons = {r.id: r.reason for _, r in rejects}
    assert "scheme 'ftp' is not supported" in reasons["x1"]
    assert "absolute local path" in reasons["x2"]
    assert "data:image/<ext>;base64,<content>" in reasons["x3"]
    assert "must begin with data:image/" in reasons["x4"]
    assert "url or base64" in reasons["x5"]
    # A Windows path (a catalogue exported on Windows) is said to be one, not a URL scheme.
    assert reasons["w1"].startswith("url is a Windows path (C:\\...), no path on this machine")
    assert reasons["w2"].startswith("url is a Windows path (d:/...), no path on this machine")
    assert all(r.stage == "client" for _, r in rejects)
    # Bulk-only validation still refuses all of them.
    assert [i[0] for i in Validator().validate(batch)[0]] == ["h"]


def test_a_path_made_a_fifo_after_its_check_is_refused_not_read_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was checked by path, then opened: a path made a FIFO in between blocked the
    single router's thread until a writer came (for ever, the row never settled)."""
    fifo = tmp_path / "p.png"
    os.mkfifo(fifo)
    regular = os.stat(red_picture(tmp_path / "r.png"))
    real_stat = os.stat

    def checked(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        # its check (by path) saw a regular file
        return regular if str(path) == str(fifo) else real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", checked)
    unblock = threading.Timer(3, lambda: open(fifo, "wb").close())  # else it hangs for ever
    unblock.start()
    try:
        with pytest.raises(SingleRejected, match="not a regular file"):
            load_image(SingleRequest(SINGLE_FILE, str(fifo), Context(id="p"), 2, "m"), 1000)
    finally:
        unblock.cancel()


# --------------------------------------------------------------------------- end to end


async def test_mixed_manifests_every_id_once_single_rows_tagged_from_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    png = red_picture(tmp_path / "imgs" / "red.png")
    jpg = red_picture(tmp_path / "imgs" / "red.jpg")
    noext = tmp_path / "imgs" / "red-no-suffix"
    noext.write_bytes(jpg.read_bytes())
    csv_rows = [(f"h{i}", f"https://img.example/{i}.jpg") for i in range(40)]
    csv_rows[20:20] = [("c-abs", "https://img.example/dup-of-a-single.jpg"), ("h3", str(png))]
    csv_rows[5:5] = [
        ("c-abs", str(png)),
        ("c-rel", "imgs/red.jpg"),
        ("c-file", jpg.as_uri()),
        ("c-data", data_uri(png)),
        ("c-magic", str(noext)),
    ]
    csv = write_csv_rows(tmp_path / "m.csv", csv_rows)
    jsonl = tmp_path / "m.jsonl"
    jrows = [{"id": f"jh{i}", "url": f"https://img.example/j{i}.jpg"} for i in range(30)]
    jrows[10:10] = [
        {"id": "j-b64", "image": {"type": "base64", "content": data_uri(jpg, "jpeg")}},
        {"id": "j-rel", "url": "imgs/red.png", "gender": "female", "age": ["20s"]},
        {"id": "j-img", "image": {"type": "url", "content": str(png)}, "detection": ["TOP"]},
    ]
    jsonl.write_text("\n".join(json.dumps(r) for r in jrows) + "\n")
    singles = {"c-abs", "c-rel", "c-file", "c-data", "c-magic", "j-b64", "j-rel", "j-img"}
    expected = {i for i, _ in csv_rows} | {r["id"] for r in jrows}
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [csv, jsonl], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete and summary.single == len(singles)
    assert summary.tagged + summary.failed == len(expected)
    o = assert_exactly_once(out, rej, expected, duplicates=2)  # across both routes
    assert summary.rejected == 2
    by_id = {r["id"]: r for r in o.results}
    assert by_id["h3"]["taskId"] is not None  # the first h3 row (bulk) won
    for ident in singles:
        r = by_id[ident]
        assert r["taskId"] is None, ident
        assert r["taggingResult"]["status"] == "success", r
        assert colors_of(r)[:1] == ["red"], (ident, colors_of(r))  # measured from the pixels
    bulk = [r for r in o.results if r["id"] not in singles]
    assert all(isinstance(r["taskId"], str) and r["taskId"] for r in bulk)
    assert summary.submitted == len(bulk)


async def test_bad_single_rows_one_specific_outcome_each(tmp_path: Path) -> None:
    good = red_picture(tmp_path / "ok.png")
    text = tmp_path / "notes.png"
    text.write_text("this is not an image\n" * 10)
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(3000))
    noise = tmp_path / "noise.jpg"  # under the engine's cap, over the service's body limit
    noise.write_bytes(b"\xff\xd8\xff" + os.urandom(1500))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    rows = [
        ("ok", str(good)),
        ("missing", str(tmp_path / "absent.png")),
        ("dir", str(tmp_path)),
        ("text", str(text)),
        ("bad64", "data:image/png;base64,!!not*base64!!"),
        ("big", str(big)),
        ("body413", str(noise)),
        ("empty", str(empty)),
        ("h1", "https://img.example/1.jpg"),
    ]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, single_max_bytes=2500)
    async with running_service(ServiceConfig(max_body_bytes=2048)) as svc:
        summary = await run_pipeline(
            [csv], client=client_config(svc.url), out=out, rejects=rej, engine=engine
        )
    assert summary.complete and summary.single == 8
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    results = {r["id"]: r for r in o.results}
    rejects = {r["id"]: r for r in o.rejects}
    assert set(results) == {"ok", "text", "h1"}
    assert results["ok"]["taggingResult"]["status"] == "success"
    # A non-image file: the service answers 200 with status failure, code 805 (like a bulk
    # image that cannot be decoded): a results line, not a reject.
    failure = results["text"]["taggingResult"]
    assert failure["status"] == "failure" and failure["error"]["code"] == 805
    assert results["text"]["taskId"] is None
    expected = {
        "missing": ("client", "local file not found"),
        "dir": ("client", "is a directory"),
        "bad64": ("client", "base64 content does not decode"),
        "big": ("client", "larger than 2500 bytes"),
        "empty": ("client", "local file is empty"),
        "body413": ("server-validation", "809: request body is larger than 2048 bytes"),
    }
    for ident, (stage, reason) in expected.items():
        assert rejects[ident]["stage"] == stage, rejects[ident]
        assert reason in rejects[ident]["reason"], rejects[ident]
        assert rejects[ident]["source"] == str(csv) and rejects[ident]["line"] >= 2


async def test_single_rows_survive_service_faults(tmp_path: Path) -> None:
    """5xx, 429 and drops on the single endpoint: the client's retries, then the run's retry
    budget; every routed row still ends in exactly one line."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(60)] + [
        (f"h{i}", f"https://img.example/{i}.jpg") for i in range(60)
    ]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    faults = FaultSpec.parse("500=0.35,429=0.1:0.01s,drop=0.1", seed=11)
    async with running_service(ServiceConfig(faults=faults)) as svc:
        summary = await run_pipeline(
            [csv], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete and summary.single == 60 and summary.rejected == 0
    assert summary.retries > 0
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    assert sum(1 for r in o.results if r["taskId"] is None) == 60


class CountingClient(TaggerClient):
    """Counts single-mode calls in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inflight = 0
        self.peak = 0
        self.calls = 0

    async def tag_raw(self, *args: Any, **kwargs: Any) -> Any:
        self.inflight += 1
        self.calls += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await anyio.sleep(0.02)
            return await super().tag_raw(*args, **kwargs)
        finally:
            self.inflight -= 1


async def test_single_concurrency_cap_is_respected(tmp_path: Path) -> None:
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(40)] + [("h", "https://img.example/h.jpg")]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, single_concurrency=3)
    async with (
        running_service(ServiceConfig()) as svc,
        CountingClient(config=client_config(svc.url)) as client,
    ):
        summary = await run_pipeline([csv], client=client, out=out, rejects=rej, engine=engine)
    assert summary.complete and summary.single == 40
    assert client.calls == 40
    assert client.peak == 3  # the cap is reached, never passed
    assert_exactly_once(out, rej, {i for i, _ in rows})


def _further(out: Path, seen: int) -> bool:
    """Whether ``out`` holds more than ``seen`` bytes, a single row's result among them."""
    try:
        data = out.read_bytes()
    except FileNotFoundError:
        return False
    return len(data) > seen and b'"taskId":null' in data


async def test_kill_9_with_single_rows_in_flight_then_resume_exactly_once(tmp_path: Path) -> None:
    pictures = [red_picture(tmp_path / f"red{k}.png") for k in range(4)]
    rows: list[tuple[str, str]] = []
    singles: set[str] = set()
    for i in range(1500):
        if i % 3 == 1:
            rows.append((f"s{i}", str(pictures[i % 4])))
            singles.add(f"s{i}")
        else:
            rows.append((f"p{i}", f"https://img.example/{i}.jpg"))
    rows.append(("p6", "https://img.example/dup.jpg"))
    manifest = write_csv_rows(tmp_path / "m.csv", rows)
    out = tmp_path / "out.jsonl"
    rej = out.with_suffix(".rej")
    state = tmp_path / "run.state"
    async with running_service(ServiceConfig(rate=600.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(state))
        args += ["--rotate-images", "300", "--single-concurrency", "4"]
        killed = []
        singles_done = []
        seen = 0
        for _ in range(3):
            proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
            # Killed once it got past the last kill with a single row's result written (kills
            # 0.9-1.3 s after the start came before any on a loaded machine).
            with anyio.fail_after(60):
                while proc.returncode is None and not _further(out, seen):
                    await anyio.sleep(0.02)
            seen = out.stat().st_size
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
            killed.append(await proc.wait())
            await proc.aclose()
            # (Whole lines only: a kill -9 may land between the writes of one line, which the
            # resume cuts back; a JSONDecodeError on that tail failed a fresh-clone CI run.)
            whole = out.read_bytes().split(b"\n")[:-1]
            singles_done.append(sum(1 for line in whole if json.loads(line)["taskId"] is None))
        assert killed.count(-signal.SIGKILL) >= 2, killed
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()
    assert b"complete" in result.stderr
    o = assert_exactly_once(out, rej, {i for i, _ in rows}, duplicates=1)
    by_id = {r["id"]: r for r in o.results}
    assert all(by_id[s]["taskId"] is None for s in singles)
    # The kills hit the single route partway (single rows were in flight).
    assert any(0 < n < len(singles) for n in singles_done), singles_done


@pytest.mark.parametrize("how", ["500", "dropped"])
async def test_an_image_the_service_always_fails_is_a_reject_not_a_stopped_run(
    tmp_path: Path, how: str
) -> None:
    """A single-mode image answered HTTP 500 every time, or whose connection the service drops
    every time (a worker that crashes on it), while the service tags the others (a poison
    image): after ``max_sends`` attempts with successes in between, a reject of stage
    ``unreturned`` saying so; the run completes rather than stopping every night on it."""
    png = red_picture(tmp_path / "red.png")
    poison = red_picture(tmp_path / "poison.jpg")
    marker = base64.b64encode(poison.read_bytes())[-120:]
    rows = [("bad", str(poison))] + [(f"s{i}", str(png)) for i in range(300)]
    rows += [(f"h{i}", f"https://img.example/{i}.jpg") for i in range(200)]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.1, linger_seconds=0.2, fsync_seconds=10.0, give_up_after=5.0
    )
    async with (
        running_service(ServiceConfig()) as svc,
        misbehaving(
            svc.url,
            Misbehaviour(fail_single_holding=marker, drop_single=how == "dropped"),
        ) as proxy,
    ):
        summary = await run_pipeline(
            [csv], client=client_config(proxy.url), out=out, rejects=rej, engine=engine
        )
    assert summary.complete and summary.error is None
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    (reject,) = o.rejects
    assert reject["id"] == "bad" and reject["stage"] == "unreturned"
    assert "5 times" in reject["reason"]
    assert how != "500" or "HTTP 500" in reject["reason"]
    assert proxy.single_failed >= 5 * 4  # max_sends attempts, each the client's 4 tries


async def test_load_shedding_rejects_no_good_image(tmp_path: Path) -> None:
    """The service sheds half of the single-mode requests with HTTP 503 (overloaded): a 503
    says the service is busy, not that the image is bad, so no row of one good picture is a
    poison image. Before, a few in a hundred were rejected ("the service failed on this image
    5 times while it tagged others"; here ``max_sends`` 2 makes it a fifth of them)."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(100)]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    engine = msgspec.structs.replace(FAST, max_sends=2)
    async with running_service(ServiceConfig(faults=FaultSpec.parse("503=0.5", seed=5))) as svc:
        # One try per call: each 503 reaches the engine (as one whose every try is shed).
        config = msgspec.structs.replace(client_config(svc.url), retry=RetryPolicy(max_attempts=1))
        summary = await run_pipeline([csv], client=config, out=out, rejects=rej, engine=engine)
    assert summary.complete and summary.rejected == 0 and summary.retries > 0
    assert_exactly_once(out, rej, {i for i, _ in rows})


async def test_a_single_endpoint_failing_for_every_image_rejects_none(tmp_path: Path) -> None:
    """The single endpoint answers HTTP 500 to every image while bulk works (the endpoint is
    down, no image is at fault): no row is rejected for it; the run stops with the state saved
    once ``give_up_after`` is spent, and the same run resumed later tags every row once."""
    png = red_picture(tmp_path / "red.png")
    rows = [(f"s{i}", str(png)) for i in range(30)]
    rows += [(f"h{i}", f"https://img.example/{i}.jpg") for i in range(1500)]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state.db"
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.1, linger_seconds=0.2, fsync_seconds=10.0, give_up_after=2.0
    )
    async with running_service(ServiceConfig(rate=500.0)) as svc:
        async with misbehaving(svc.url, Misbehaviour(fail_single_holding=b"")) as proxy:
            with pytest.raises(FatalRunError, match="single-mode tag"):
                await run_pipeline(
                    [csv],
                    client=client_config(proxy.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=engine,
                )
        assert proxy.single_failed > 30
        assert read_outcomes(out, rej).rejects == []
        summary = await run_pipeline(
            [csv], client=client_config(svc.url), out=out, rejects=rej, state=state, engine=engine
        )
    assert summary.complete and summary.rejected == 0
    assert_exactly_once(out, rej, {i for i, _ in rows})


async def test_relative_paths_resumed_from_another_directory_are_the_run_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative image paths are read from the directory the run was begun in: a run stopped
    (the single endpoint down past give_up_after) and resumed from another directory (cron's
    next start, a person's shell) had the rows it had not yet read made rejects, 'local file
    not found' under the new directory, and reported complete (exit 0)."""
    begun, other = tmp_path / "begun", tmp_path / "other"
    (begun / "imgs").mkdir(parents=True)
    other.mkdir()
    red_picture(begun / "imgs" / "red.png")
    rows = [(f"s{i}", "imgs/red.png") for i in range(200)]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    out, rej, state = tmp_path / "out.jsonl", tmp_path / "rej.jsonl", tmp_path / "state.db"
    engine = msgspec.structs.replace(
        FAST, read_batch_rows=10, queue_batches=1, single_concurrency=2, give_up_after=1.0
    )
    monkeypatch.chdir(begun)
    async with running_service(ServiceConfig(faults=FaultSpec.parse("503=1.0"))) as svc:
        with pytest.raises(FatalRunError, match="single-mode tag"):
            await run_pipeline(
                [csv],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                state=state,
                engine=engine,
            )
    monkeypatch.chdir(other)
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [csv], client=client_config(svc.url), out=out, rejects=rej, state=state, engine=engine
        )
    assert summary.complete and summary.rejected == 0, read_outcomes(out, rej).rejects[:1]
    o = assert_exactly_once(out, rej, {i for i, _ in rows})
    assert all(r["taggingResult"]["status"] == "success" for r in o.results)


async def test_a_data_uri_in_capitals_is_tagged(tmp_path: Path) -> None:
    """A data: URI's scheme, media type and ``;base64`` are case-insensitive (RFC 2397, as
    ``HTTPS://`` is taken): ``DATA:image/png;base64,...`` was a reject saying that scheme
    'DATA' is not supported, and ``data:IMAGE/PNG;BASE64,...`` that it must be data:image/...;
    JSONL's ``image.content`` likewise. Each is sent lower-cased and tagged."""
    png = data_uri(red_picture(tmp_path / "red.png"))
    payload = png.partition(",")[2]
    rows = [
        ("upper", "DATA:image/png;base64," + payload),
        ("mixed", "Data:IMAGE/PNG;BASE64," + payload),
    ]
    csv = write_csv_rows(tmp_path / "m.csv", rows)
    jsonl = tmp_path / "m.jsonl"
    image = {"type": "base64", "content": "DATA:Image/Png;Base64," + payload}
    jsonl.write_text(json.dumps({"id": "j", "image": image}) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [csv, jsonl], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete and summary.rejected == 0, read_outcomes(out, rej).rejects
    o = assert_exactly_once(out, rej, {"upper", "mixed", "j"})
    for r in o.results:
        assert r["taggingResult"]["status"] == "success" and colors_of(r)[:1] == ["red"], r
