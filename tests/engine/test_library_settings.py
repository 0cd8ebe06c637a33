"""The settings objects a program builds in Python (``EngineConfig``, ``ClientConfig`` and its
``Timeout``, ``RetryPolicy``, ``Limits``): a TOML file's values are checked against each field's
type (``msgspec.convert``), but a Struct built in code is not, so a value of the wrong type
(a number read from an environment variable, still a ``str``; a float from arithmetic; a bare
number where a ``Timeout`` goes) was taken as it was. Found by a hunt; failed before its fix.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline import ClientConfig, Timeout
from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.jobs import JobSpec
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config, ids_of, write_csv

FAST: dict[str, Any] = {"poll_min": 0.02, "poll_max": 0.2, "linger_seconds": 0.05}

#: Settings of the wrong type (``engine=`` or ``client=`` keyword arguments), and the field the
#: error must name. Each went: the run started, took rows in and ended on a traceback from deep
#: inside (a slice of a float, a semaphore of one, ``'int' object has no attribute 'total'`` at
#: the first request), or went on as something else (one letter of the detection string sent,
#: a sink of no kind recorded in the state).
WRONG: list[tuple[str, dict[str, Any], str]] = [
    ("engine", {"chunk_size": 500.0}, "engine.chunk_size"),
    ("engine", {"max_write_concurrency": 2.0}, "engine.max_write_concurrency"),
    ("engine", {"read_batch_rows": "500"}, "engine.read_batch_rows"),
    ("engine", {"rotate_images": "20000"}, "engine.rotate_images"),
    ("engine", {"default_detection": "TOP"}, "engine.default_detection"),
    ("engine", {"sink": "csv"}, "engine.sink"),
    ("client", {"timeout": 5}, "timeout"),
    ("client", {"retry": 3}, "retry"),
    ("client", {"limits": 64}, "limits"),
    ("client", {"timeout": {"connect": "10"}}, "timeout.connect"),
    ("client", {"base_url": 8080}, "base_url"),
]


def _settings(url: str, which: str, wrong: dict[str, Any]) -> tuple[ClientConfig, EngineConfig]:
    if which == "engine":
        return client_config(url), EngineConfig(**FAST, **wrong)
    if isinstance(wrong.get("timeout"), dict):
        wrong = {"timeout": Timeout(**wrong["timeout"])}
    return ClientConfig(**{"base_url": url, **wrong}), EngineConfig(**FAST)


@pytest.mark.parametrize(("which", "wrong", "field"), WRONG, ids=[w[2] for w in WRONG])
async def test_a_setting_of_the_wrong_type_is_refused_naming_its_field(
    tmp_path: Path, which: str, wrong: dict[str, Any], field: str
) -> None:
    """``EngineConfig(chunk_size=500.0)``, ``ClientConfig(timeout=5)``: refused where it is
    built, a TypeError naming the field, before any row is read or sent; the same run with the
    setting of its type then tags every row once."""
    manifest = write_csv(tmp_path / "m.csv", 1500)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        with pytest.raises(TypeError) as caught:
            client, engine = _settings(svc.url, which, wrong)
            with anyio.fail_after(30):
                await run_pipeline([manifest], client=client, out=out, rejects=rej, engine=engine)
        assert field in str(caught.value)
        assert svc.store.image_count == 0  # nothing sent
        assert not (tmp_path / "out.jsonl.state").exists()  # nothing begun
        with anyio.fail_after(30):
            summary = await run_pipeline(
                [manifest],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                engine=EngineConfig(**FAST),
            )
    assert summary.complete
    assert_exactly_once(out, rej, ids_of(1500))
    assert svc.store.image_count == 1500


#: Arguments of the wrong kind to ``run_pipeline``, and the parameter the error must name. Each
#: was an AttributeError (``'str' object has no attribute 'language'``, ``'dict' object has no
#: attribute 'reuse'``) or a TypeError of ``os.fspath``, the client's made after the state file
#: was (a run of the manifests recorded).
ARGUMENTS: list[tuple[str, Any]] = [
    ("client", "URL"),  # the service's URL, not ClientConfig(base_url=...)
    ("client", {"base_url": "URL"}),
    ("engine", {"chunk_size": 100}),
    ("state", 5),
    ("out", None),
    ("rejects", None),
]


@pytest.mark.parametrize(("name", "value"), ARGUMENTS, ids=[f"{n}-{v!r}" for n, v in ARGUMENTS])
async def test_an_argument_of_the_wrong_kind_is_refused_naming_it(
    tmp_path: Path, name: str, value: Any
) -> None:
    """``run_pipeline(["m.csv"], client="http://...", ...)`` (a notebook's first try): a
    TypeError that names the parameter and what it takes, before anything is made."""
    manifest = write_csv(tmp_path / "m.csv", 100)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        given: dict[str, Any] = {
            "client": client_config(svc.url),
            "out": out,
            "rejects": rej,
            "engine": EngineConfig(**FAST),
        }
        if value == "URL":
            value = svc.url
        elif isinstance(value, dict) and value.get("base_url") == "URL":
            value = {"base_url": svc.url}
        given[name] = value
        with pytest.raises(TypeError, match=rf"^{name}: "), anyio.fail_after(30):
            await run_pipeline([manifest], **given)
        assert svc.store.image_count == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]  # nothing made


async def test_a_job_of_a_sink_of_no_kind_is_refused(tmp_path: Path) -> None:
    """``JobSpec(..., sink="SQLite")`` (or ``"sqllite"``): the job was taken, its results
    written as JSONL into the file the program meant as a SQLite database (its reader failing
    on it next), the misspelt kind recorded in the state. Refused where it is made, a
    ValueError naming ``sink`` and its kinds; the job of a kind then runs."""
    manifest = write_csv(tmp_path / "m.csv", 300)
    results, rejects = tmp_path / "results.sqlite", tmp_path / "rejects.jsonl"
    for sink in ("SQLite", "sqllite", "csv"):
        with pytest.raises(ValueError, match=r"sink.*jsonl.*sqlite"):
            JobSpec(key="k", manifests=[str(manifest)], results=results, rejects=rejects, sink=sink)
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(tmp_path / "state")
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client, db=db, state=db.open_engine(), config=EngineConfig(**FAST)
            )
            with anyio.fail_after(30):
                async with engine:
                    spec = JobSpec(
                        key="k",
                        manifests=[str(manifest)],
                        results=results,
                        rejects=rejects,
                        sink="sqlite",
                    )
                    job = await engine.submit(spec)
                    engine.close()
                    await engine.outcome(job)
    with sqlite3.connect(results) as db_file:  # a SQLite file, every row in it
        (rows,) = db_file.execute("SELECT count(*) FROM results").fetchone()
    assert rows == 300


@pytest.mark.parametrize(
    ("wrong", "said"),
    [
        ({"default_detection": ["top"]}, "'top'"),
        ({"default_detection": ["TOP", "shoes"]}, "'shoes'"),
        ({"sink": "SQLite"}, "'SQLite'"),
    ],
    ids=["lower-case", "second", "sink"],
)
def test_a_setting_of_the_right_type_but_no_allowed_value_says_which(
    wrong: dict[str, Any], said: str
) -> None:
    """``EngineConfig(default_detection=["top"])`` (the service's values are upper-case) was
    refused as ``must be list[Detection] | None, got list``: a list refused for not being one.
    The error names the value that is none of the allowed ones (the TOML file's error does)."""
    with pytest.raises(TypeError) as caught:
        EngineConfig(**wrong)
    assert said in str(caught.value), caught.value
