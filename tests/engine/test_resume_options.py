"""A resume asks its rows what the run was begun with, and a result store is never given an
answer under another question.

Found by a hunt: a run stopped after sending its rows and resumed with another ``--language``
read their results in the new language and stored them under the first attempt's (language,
row) fingerprints; a resume with another ``--detection`` sent the rows still waiting with it
and stored those answers as the default detection's. Every later night reused the wrong
results (for up to ``--reuse-max-age``), with exit 0. And ``--reuse`` given the path of
``--out`` turned the results file into the store's SQLite file, with exit 0.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from fashiontag_pipeline import StateConflictError
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.pages import PageRow
from fashiontag_pipeline.engine.reuse import ReuseHook
from fashiontag_pipeline.engine.reuse.fingerprint import Fingerprinter
from fashiontag_pipeline.engine.reuse.store import open_store
from fashiontag_pipeline.engine.state import reuse_rows
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, client_config, run_args, taken_in

N = 300


def _engine(store: Path | None, **kw: Any) -> EngineConfig:
    base: dict[str, Any] = {
        "poll_min": 0.02,
        "poll_max": 0.2,
        "linger_seconds": 0.2,
        "rotate_min_images": 50,
        "reuse": str(store) if store is not None else None,
    }
    return EngineConfig(**{**base, **kw})


def _results(path: Path) -> dict[str, Any]:
    return {r["id"]: r["taggingResult"] for r in map(json.loads, path.read_text().splitlines())}


def _manifest(path: Path, ids: range, skip_every: int = 0) -> Path:
    rows = (f"p{i},https://img.example/{i}.jpg\n" for i in ids if not skip_every or i % skip_every)
    path.write_text("id,url\n" + "".join(rows))
    return path


async def _night2_matches_the_truth(
    tmp_path: Path, url: str, manifest: Path, store: Path, **client: Any
) -> int:
    """Another night with the store, and the answers without it: every row alike. Returns
    how many rows the night reused."""
    night2 = await run_pipeline(
        [manifest],
        client=client_config(url, **client),
        out=tmp_path / "b.jsonl",
        rejects=tmp_path / "b.rej",
        engine=_engine(store),
    )
    truth = await run_pipeline(
        [manifest],
        client=client_config(url, **client),
        out=tmp_path / "c.jsonl",
        rejects=tmp_path / "c.rej",
        engine=_engine(None),
    )
    assert night2.complete and truth.complete
    got, want = _results(tmp_path / "b.jsonl"), _results(tmp_path / "c.jsonl")
    assert set(got) == set(want)
    wrong = sorted(i for i in got if got[i] != want[i])
    assert wrong == [], f"{len(wrong)} rows reused with another question's answer: {wrong[:5]}"
    return night2.reused


@pytest.mark.parametrize("resumed_in", ["en", "ko"])
async def test_a_resume_in_another_language_is_refused_and_the_store_stays_true(
    tmp_path: Path, resumed_in: str
) -> None:
    store = tmp_path / "reuse.db"
    manifest = _manifest(tmp_path / "m.csv", range(N))
    out, rej, state = tmp_path / "a.jsonl", tmp_path / "a.rej", tmp_path / "a.state"

    async def attempt(language: str) -> Any:
        return await run_pipeline(
            [manifest],
            client=client_config(svc.url, language=language),
            out=out,
            rejects=rej,
            state=state,
            engine=_engine(store),
        )

    async with running_service(ServiceConfig(rate=200.0)) as svc:
        # Stopped once its rows are sent, before their pages (not a fixed 1 s, which on a
        # loaded machine may come before they are sent: the resume then has no task of them).
        async with anyio.create_task_group() as tg:

            async def stop_once_sent() -> None:
                with anyio.fail_after(60):
                    while True:
                        accepted, _, unknown = taken_in(state)
                        if svc.store.image_count >= N and accepted >= N and not unknown:
                            break
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()

            tg.start_soon(stop_once_sent)
            await attempt("en")
        if resumed_in != "en":
            with pytest.raises(StateConflictError, match="begun with --language en") as err:
                await attempt(resumed_in)
            assert f"gives --language {resumed_in}" in str(err.value)
        done = await attempt("en")
        assert done.complete
        reused = await _night2_matches_the_truth(tmp_path, svc.url, manifest, store)
    assert reused == N


async def test_a_resume_with_another_detection_is_refused_and_the_store_stays_true(
    tmp_path: Path,
) -> None:
    store = tmp_path / "reuse.db"
    n = 20_000
    known = _manifest(tmp_path / "known.csv", range(n), skip_every=10)
    manifest = _manifest(tmp_path / "m.csv", range(n))
    out, rej, state = tmp_path / "a.jsonl", tmp_path / "a.rej", tmp_path / "a.state"
    async with running_service(ServiceConfig(rate=0)) as svc:
        seed = await run_pipeline(
            [known],
            client=client_config(svc.url),
            out=tmp_path / "seed.jsonl",
            rejects=tmp_path / "seed.rej",
            engine=_engine(store),
        )
        assert seed.complete
        # The rows the store does not know linger in a partial chunk when the run stops.
        async with anyio.create_task_group() as tg:

            async def first_attempt() -> None:
                await run_pipeline(
                    [manifest],
                    client=client_config(svc.url),
                    out=out,
                    rejects=rej,
                    state=state,
                    engine=_engine(store, linger_seconds=30.0),
                )

            tg.start_soon(first_attempt)
            with anyio.fail_after(30):  # stopped once reused lines are out
                while not (out.exists() and b"\n" in out.read_bytes()):
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        assert 0 < len(out.read_text().splitlines()) < n
        with pytest.raises(StateConflictError, match="--detection SHOES"):
            await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                state=state,
                engine=_engine(store, default_detection=["SHOES"]),
            )
        done = await run_pipeline(
            [manifest],
            client=client_config(svc.url),
            out=out,
            rejects=rej,
            state=state,
            engine=_engine(store),
        )
        assert done.complete
        await _night2_matches_the_truth(tmp_path, svc.url, manifest, store)


def test_rows_in_flight_under_another_question_are_not_stored(tmp_path: Path) -> None:
    """The daemon's way in: its engine state always resumes, and a restart may bring another
    language or default detection. Rows pending from before are still sent and written (a
    resume must tell them from rows answered from the store) but their results are not
    stored: they answer the new question, not the one their fingerprints were taken for."""
    db = sqlite3.connect(tmp_path / "state.sqlite", isolation_level=None)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    english = ReuseHook(open_store(str(tmp_path / "store.db")), Fingerprinter(language="en"))
    english.prepare(db, resumed=False)
    for sql, params in reuse_rows.pending_rows([("p1", b"f" * 16), ("p2", b"g" * 16)]):
        db.execute(sql, params)
    english.store.close()

    def restarted(language: str) -> ReuseHook:
        hook = ReuseHook(open_store(str(tmp_path / "store.db")), Fingerprinter(language=language))
        hook.prepare(db, resumed=True)
        return hook

    korean = restarted("ko")
    assert set(reuse_rows.pending_fingerprints(db, ["p1", "p2"])) == {"p1", "p2"}
    rows = [PageRow("p1", msgspec.Raw(b'{"status":"success","data":{}}'))]
    for sql, params in korean.store_page(db, "t1", rows):
        db.execute(sql, params)
    assert korean.stored == 0
    assert set(reuse_rows.pending_fingerprints(db, ["p1", "p2"])) == {"p2"}
    korean.store.close()
    # The same question as the last start: rows pending under it are stored as ever.
    for sql, params in reuse_rows.pending_rows([("p3", b"h" * 16)]):
        db.execute(sql, params)
    again = restarted("ko")
    for sql, params in again.store_page(db, "t2", [PageRow("p3", rows[0].tagging_result)]):
        db.execute(sql, params)
    assert again.stored == 1
    again.store.close()


async def test_a_result_store_at_the_results_path_is_refused(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path / "m.csv", range(30))
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig(rate=0)) as svc:
        for same in (out, tmp_path / "results.rej"):
            cli = await anyio.run_process(
                [*run_args(svc.url, out, str(manifest)), "--reuse", str(same)],
                check=False,
                env=ENV,
            )
            assert cli.returncode == 2, cli.stderr.decode()
            assert "--reuse are the same file" in cli.stderr.decode()
            assert not out.exists() or b"SQLite" not in out.read_bytes()
