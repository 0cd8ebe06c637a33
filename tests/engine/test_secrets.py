"""Promise 5: API keys never appear in logs, errors, reprs, state or output files.

The engine runs as the CLI (a subprocess, ``-vv`` debug logging) with distinctive keys, once
successfully and once with a wrong bulk key (a fatal run), and the key strings are looked for
in everything it leaves: stdout, stderr, results, rejects, summary, and the raw bytes of the
SQLite state file and its WAL. The Python API is checked the same way (summary and exception
text, reprs of the config and client).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline import ClientConfig, Secret, TaggerClient
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import dead_port, write_csv

KEY = "sk-LEAK-CANARY-1"
BULK_KEY = "sk-LEAK-CANARY-2"
WRONG_BULK_KEY = "sk-LEAK-CANARY-3"
CANARIES = (KEY, BULK_KEY, WRONG_BULK_KEY)
# Also the parts a careless log line might keep (a prefix cut, the key's tail).
FRAGMENTS = (*CANARIES, "LEAK-CANARY")

SERVICE = ServiceConfig(api_keys=(KEY,), bulk_api_keys=(BULK_KEY,))


def _leaks(data: bytes) -> list[str]:
    return [f for f in FRAGMENTS if f.encode() in data]


def _files(tmp: Path, stem: str) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith(stem))


async def _cli(tmp: Path, stem: str, url: str, bulk_key: str, rows: int) -> tuple[int, bytes]:
    manifest = write_csv(tmp / f"{stem}-m.csv", rows)
    env = {
        **os.environ,
        "FASHIONTAG_API_KEY": KEY,
        "FASHIONTAG_BULK_API_KEY": bulk_key,
        "FASHIONTAG_BASE_URL": url,
    }
    argv = [
        sys.executable,
        "-m",
        "fashiontag_pipeline",
        "-vv",
        "run",
        str(manifest),
        "--out",
        str(tmp / f"{stem}-out.jsonl"),
        "--rejects",
        str(tmp / f"{stem}-rej.jsonl"),
        "--state",
        str(tmp / f"{stem}-state.db"),
        "--summary",
        str(tmp / f"{stem}-summary.json"),
        "--no-progress",
        "--give-up-after",
        "5",
    ]
    result = await anyio.run_process(argv, env=env, check=False)
    return result.returncode, result.stdout + b"\n" + result.stderr


async def test_cli_keys_appear_nowhere_even_with_debug_logs_and_a_fatal_run(
    tmp_path: Path,
) -> None:
    async with running_service(SERVICE) as svc:
        ok_code, ok_out = await _cli(tmp_path, "ok", svc.url, BULK_KEY, 300)
        bad_code, bad_out = await _cli(tmp_path, "bad", svc.url, WRONG_BULK_KEY, 300)
    assert ok_code == 0, ok_out.decode(errors="replace")[-2000:]
    assert bad_code not in (0, None)
    # the debug logs did run (the check is not vacuous) and the fatal run said why
    assert b"DEBUG" in ok_out or b"debug" in ok_out.lower()
    assert b"401" in bad_out or b"refused" in bad_out
    assert not _leaks(ok_out), "a key in the output of the successful run"
    assert not _leaks(bad_out), "a key in the output of the fatal run"
    for stem in ("ok", "bad"):
        files = _files(tmp_path, f"{stem}-")
        names = {p.name for p in files}
        assert f"{stem}-state.db" in names
        assert f"{stem}-out.jsonl" in names and f"{stem}-rej.jsonl" in names
        for path in files:  # results, rejects, summary, state and its -wal / -shm
            assert not _leaks(path.read_bytes()), f"a key in {path.name}"
    assert (tmp_path / "ok-out.jsonl").stat().st_size > 0
    assert (tmp_path / "ok-summary.json").exists()


async def test_api_keys_appear_in_no_summary_error_or_repr(tmp_path: Path) -> None:
    manifest = write_csv(tmp_path / "m.csv", 50)
    async with running_service(SERVICE) as svc:
        config = ClientConfig(
            base_url=svc.url, api_key=Secret(KEY), bulk_api_key=Secret(WRONG_BULK_KEY)
        )
        client = TaggerClient(config=config)
        texts = [repr(config), str(config), repr(client), repr(config.bulk_api_key)]
        with pytest.raises(Exception) as caught:
            await run_pipeline(
                [manifest],
                client=config,
                out=tmp_path / "out.jsonl",
                rejects=tmp_path / "rej.jsonl",
                engine=EngineConfig(give_up_after=5.0),
            )
        await client.aclose()
    err = caught.value
    texts += [str(err), repr(err), repr(err.__cause__), str(err.__cause__)]
    assert not _leaks("\n".join(texts).encode())
    for path in tmp_path.iterdir():
        assert not _leaks(path.read_bytes()), f"a key in {path.name}"


@pytest.mark.parametrize(
    "typo",
    [
        ("--api_key=" + KEY,),  # the [client] field's spelling, as a flag
        ("--bulk-apikey", BULK_KEY),
        ("--base_url=http://tagger:sk-LEAK-CANARY-pw@127.0.0.1:9",),
        ("--password", "sk-LEAK-CANARY-pw"),
        ("--api-keys=" + KEY,),  # the plural (serve takes several)
        ("--bulk_api_keys", BULK_KEY),
        ("--api_key", "-" + KEY),  # a key that begins with '-' (base64url)
        ("--b=" + BULK_KEY,),  # an ambiguous abbreviation of --bulk-api-key
    ],
    ids=[
        "api_key=",
        "bulk-apikey",
        "base_url=",
        "password",
        "api-keys=",
        "bulk_api_keys",
        "dash-key",
        "ambiguous",
    ],
)
async def test_a_misspelt_key_flag_is_refused_without_its_key(
    tmp_path: Path, typo: tuple[str, ...]
) -> None:
    """``--api_key=KEY`` (the config file's spelling) or ``--bulk-apikey KEY``: argparse
    refused the line with ``unrecognized arguments: --api_key=KEY``, the key in clear on
    stderr (cron's mail, the journal) and in the ``--summary`` a monitor reads (an output
    file). The refusal names the flag, never its value (nor a URL's password)."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    summary = tmp_path / "summary.json"
    for command in (["run", str(manifest), "--summary", str(summary)], ["tag", "x.jpg"]):
        argv = [sys.executable, "-m", "fashiontag_pipeline", *command, *typo]
        result = await anyio.run_process(argv, check=False)
        err = result.stderr.decode()
        assert result.returncode == 2, err
        refused = "unrecognized arguments" in err or "ambiguous option" in err
        assert refused and typo[0].partition("=")[0] in err, err
        assert not _leaks(result.stderr), err
    assert not _leaks(summary.read_bytes()), summary.read_text()


async def test_a_libpq_keyword_string_is_refused_not_taken_for_a_file(tmp_path: Path) -> None:
    """``--state "host=db dbname=tags user=tagger password=..."`` (libpq's keyword/value form,
    pasted from a ``psql`` line or a Django setting) was taken for a file path: the run made
    the folders ``host=db dbname=...`` (a host of ``/var/run/postgresql``: its parents too), a
    SQLite state named after the password beside them, tagged on it (exit 0, the shared state
    never used) and printed its path, password and all, on its last line. It is refused as a
    URL of another kind is (exit 2), saying to write a ``postgresql://`` URL, nothing made."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    text = "host=/var/run/postgresql dbname=tags user=tagger password=sk-LEAK-CANARY-pw"
    fashiontag = [sys.executable, "-m", "fashiontag_pipeline"]
    dead = f"http://127.0.0.1:{dead_port()}"
    runs = [
        ["run", str(manifest), "--state", text, "--base-url", dead],
        ["run", str(manifest), "--reuse", f"  {text}", "--base-url", dead],
        ["daemon", "--inbox", str(tmp_path), "--outbox", str(tmp_path / "o"), "--state", text],
        ["daemon", "--inbox", str(tmp_path), "--outbox", str(tmp_path / "o"), "--reuse", text],
        ["reuse", "stats", "service=tags"],
        ["reuse", "prune", text, "--older-than", "30d"],
    ]
    for args in runs:
        with anyio.fail_after(30):
            result = await anyio.run_process([*fashiontag, *args], check=False, cwd=tmp_path)
        err = result.stderr.decode()
        assert result.returncode == 2, (args, err)
        assert "keyword=value" in err and "postgresql://" in err, err
        assert not _leaks(result.stdout + result.stderr), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]


async def test_a_reuse_url_of_another_kind_is_refused_without_its_password(
    tmp_path: Path,
) -> None:
    """``--reuse postgresql+psycopg://tagger:PASSWORD@db/x`` (SQLAlchemy's spelling, pasted
    from an application's settings) was taken for a file path: the run created a SQLite store
    in ``./postgresql+psycopg:/tagger:PASSWORD@db/x``, warned ``result store ... did not
    exist: created it`` with the password in clear, and tagged every row without the shared
    store; ``reuse stats`` showed it too. It is refused as such a ``--state`` is (exit 2, the
    URL shown without its password), nothing created."""
    manifest = write_csv(tmp_path / "m.csv", 5)
    url = "postgresql+psycopg://tagger:sk-LEAK-CANARY-pw@db.internal/fashiontag"
    summary = tmp_path / "summary.json"
    fashiontag = [sys.executable, "-m", "fashiontag_pipeline"]
    dead = f"http://127.0.0.1:{dead_port()}"
    runs = [
        ["run", str(manifest), "--reuse", url, "--summary", str(summary), "--base-url", dead],
        ["run", str(manifest), "--reuse", url, "--state", "postgresql://tagger@db.internal/x"],
        ["daemon", "--inbox", str(tmp_path), "--outbox", str(tmp_path / "o"), "--reuse", url],
        ["reuse", "stats", url],
        ["reuse", "prune", url, "--older-than", "30d"],
    ]
    for args in runs:
        with anyio.fail_after(30):  # (before, the daemon ran on with a store of its own)
            result = await anyio.run_process([*fashiontag, *args], check=False, cwd=tmp_path)
        err = result.stderr.decode()
        assert result.returncode == 2, (args, err)
        assert "postgresql+psycopg://tagger:***@db.internal" in err, err
        assert not _leaks(result.stdout + result.stderr), err
    assert not _leaks(summary.read_bytes())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv", "summary.json"]
