"""The metrics op of each request the client sends (names of DESIGN's metrics contract)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fashiontag_pipeline._http import BULK_PATH, SINGLE_PATH
from fashiontag_pipeline.daemon.monitor import op_of
from fashiontag_pipeline.engine.reuse import ResultStore

from .helpers import daemon_once


@pytest.mark.parametrize(
    ("method", "path", "op"),
    [
        ("POST", BULK_PATH, "create"),
        ("PUT", f"{BULK_PATH}/t-1", "append"),
        ("GET", BULK_PATH, "list"),
        ("GET", f"{BULK_PATH}/t-1/status", "status"),
        ("GET", f"{BULK_PATH}/t-1", "results"),
        ("POST", SINGLE_PATH, "single"),
    ],
)
def test_every_request_has_its_op(method: str, path: str, op: str) -> None:
    assert op_of(method, path) == op


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--outbox", "OUT"], "daemon.inbox is required"),
        (["--inbox", "IN"], "daemon.outbox is required"),
        (["--inbox", "missing-folder", "--outbox", "OUT"], "is not a folder"),
        (
            ["--inbox", "IN", "--outbox", "OUT", "--state", "mysql://u:s3cret@h/db"],
            "not a state this fashiontag can use",
        ),
        (["--inbox", "IN", "--outbox", "OUT", "--lease", "0"], "daemon.lease"),
        (
            [
                "--inbox",
                "IN",
                "--outbox",
                "OUT",
                "--state",
                "postgresql://u:s3cret@h/db",
                "--sink",
                "sqlite",
            ],
            "--sink sqlite is for fashiontag run",
        ),
        (["--inbox", "IN", "--outbox", "OUT", "--sink", "sqlite"], "--sink sqlite is for"),
        (["--inbox", "IN", "--outbox", "OUT", "--max-active", "0"], "max_active"),
        (["--inbox", "IN", "--outbox", "OUT", "--listen", "nope"], "listen"),
        # nan was taken: no file without NAME.ready ever settled (nothing tagged, no word), a
        # traceback at the first scan, or at SIGTERM's drain; /readyz never said 503
        (["--inbox", "IN", "--outbox", "OUT", "--settle", "nan"], "daemon.settle"),
        (["--inbox", "IN", "--outbox", "OUT", "--scan-interval", "nan"], "daemon.scan_interval"),
        (["--inbox", "IN", "--outbox", "OUT", "--scan-interval", "inf"], "daemon.scan_interval"),
        (["--inbox", "IN", "--outbox", "OUT", "--drain-timeout", "nan"], "daemon.drain_timeout"),
        # exit 1 (SQLite's "unable to open database file"), at every restart of a supervisor
        (["--inbox", "IN", "--outbox", "OUT", "--state", "IN"], "is a folder"),
        # --reuse FOLDER: exit 1, "move it away to start an empty store", at every restart
        (["--inbox", "IN", "--outbox", "OUT", "--listen", "", "--reuse", "IN"], "is a folder"),
    ],
)
def test_bad_daemon_options_are_one_clear_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "IN").mkdir()
    argv = [a if a not in ("IN", "OUT", "missing-folder") else str(tmp_path / a) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "daemon", *argv],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.decode()
    assert b"s3cret" not in proc.stderr
    assert proc.stdout == b""


@pytest.mark.parametrize("under", ["", "sub"], ids=["file", "under-a-file"])
def test_an_outbox_that_is_a_file_is_one_clear_line_and_exit_2(tmp_path: Path, under: str) -> None:
    """``--outbox FILE`` (a regular file where a folder is expected, or a path under one):
    the daemon logged ``FileExistsError`` (or ``NotADirectoryError``) from its mkdir as its
    only explanation, and exited 1. It is refused as the inbox is: exit 2, naming the path."""
    (tmp_path / "IN").mkdir()
    (tmp_path / "results.jsonl").write_text("")
    outbox = tmp_path / "results.jsonl" / under if under else tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "daemon",
            "--inbox",
            str(tmp_path / "IN"),
            "--outbox",
            str(outbox),
            "--state",
            str(tmp_path / "d.state"),
        ],
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert f"outbox {outbox} is not a folder" in err, err
    assert "FileExistsError" not in err and "NotADirectoryError" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d.state").exists()


@pytest.mark.parametrize("existing", [True, False], ids=["last-nights-store", "missing"])
def test_a_daemon_given_one_file_as_state_and_result_store_is_refused(
    tmp_path: Path, existing: bool
) -> None:
    """``--state`` and ``--reuse`` naming one file (a config line copied, a variable set
    twice): ``run`` refuses it (exit 2), but the daemon wrote its state (its manifests' rows,
    claims and tasks) into last night's result store and ran on, one file that losing the state
    (the way to start a daemon over) took the store with, and every row billed again; a
    missing file was exit 1 at every restart ("not a fashiontag result store", the state made
    it first). Refused as ``run`` refuses it: exit 2, naming both, the file left as it was."""
    store = tmp_path / "results.db"
    if existing:
        ResultStore.open(store).close()
    before = store.read_bytes() if existing else None
    proc, _ = daemon_once(tmp_path, "--state", str(store), "--reuse", str(store))
    assert proc.returncode == 2, proc.stderr
    assert "--state and --reuse are the same file" in proc.stderr.decode()
    assert (store.read_bytes() if existing else None) == before
    assert existing or not store.exists()


def test_run_names_a_state_url_it_cannot_use_without_its_password(tmp_path: Path) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "run",
            str(manifest),
            "--state",
            "postgresql://tagger:s3cret@127.0.0.1:1/fashiontag?connect_timeout=2",
            "--out",
            str(tmp_path / "out.jsonl"),
        ],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert b"PostgreSQL state postgresql://tagger:***@127.0.0.1:1/fashiontag" in proc.stderr
    assert b"cannot open" in proc.stderr
    assert b"s3cret" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]


def test_a_daemon_state_url_libpq_cannot_read_is_refused_at_once_without_its_password(
    tmp_path: Path,
) -> None:
    """A password with a ``%`` that is no percent-encoding (``s%zz...``, pasted unencoded):
    libpq's message quotes it (``invalid percent-encoded token: "s%zz..."``). The daemon's
    connection pool logged that message at each of its tries, the password in clear in the
    JSON logs, and the daemon stopped 10 s later on ``pool initialization incomplete``, the
    reason hidden. The URL is read before the pool is made: one line, at once, masked."""
    password = "s%zzPG-CANARY"
    state = f"postgresql://tagger:{password}@/fashiontag?host={tmp_path}"
    proc, took = daemon_once(tmp_path, "--state", state, "--log-format", "json")
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "PG-CANARY" not in err, err
    assert "percent-encoded" in err and took < 8, (took, err)


def test_daemon_help_offers_only_the_sink_it_accepts() -> None:
    """``fashiontag daemon --help`` offered ``--sink {jsonl,sqlite}``, and ``--sink sqlite``
    was then refused with exit 2: the help lists only what the daemon takes."""
    proc = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "daemon", "--help"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    text = proc.stdout.decode()
    assert "--sink {jsonl}" in text and "{jsonl,sqlite}" not in text
    sink_help = text[text.index("  --sink") :].split("\n  --", 1)[0]
    assert "sqlite" not in sink_help.lower(), sink_help


@pytest.mark.parametrize(
    ("flag", "where", "message"),
    [
        ("--state", "fifo", "is not a regular file"),
        ("--state", "/dev/null", "is not a regular file"),
        ("--reuse", "/dev/null", "is not a regular file"),
        ("--state", "gone/d.state", "is a symlink to"),
        ("--reuse", "gone/results.db", "is a symlink to"),
        ("--outbox", "gone", "is a symlink to"),
        ("--outbox", "gone/out", "is a symlink to"),
    ],
)
def test_a_daemon_state_store_or_outbox_on_a_pipe_or_an_unmounted_link_is_refused(
    tmp_path: Path, flag: str, where: str, message: str
) -> None:
    """The daemon's ``--state`` or ``--reuse`` naming a pipe or a device, or a path whose
    folder is a symlink to nothing (a file system not mounted tonight), and an ``--outbox``
    that is one or under one: ``run`` refuses each (exit 2), but the daemon started and
    stopped, exit 1, on SQLite's "disk I/O error" or a bare "File exists", at every restart
    of its supervisor. Refused as ``run`` refuses them: exit 2, one line naming the path."""
    (tmp_path / "IN").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "gone").symlink_to(tmp_path / "not-mounted")
    path = where if where.startswith("/") else str(tmp_path / where)
    flags = {"--inbox": str(tmp_path / "IN"), "--outbox": str(tmp_path / "OUT"), "--listen": ""}
    flags |= {"--state": str(tmp_path / "d.state"), "--base-url": "http://127.0.0.1:9", flag: path}
    args = [word for pair in flags.items() for word in pair]
    proc = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "daemon", *args],
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert message in err and path in err, err
    assert "File exists" not in err and "disk I/O" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "not-mounted").exists()


@pytest.mark.parametrize(
    ("inbox", "outbox"),
    [("box", "box"), ("box", "box/out"), ("box/in", "box"), ("box", "link")],
    ids=["same", "outbox-inside", "inbox-inside", "same-by-symlink"],
)
def test_an_inbox_and_outbox_that_overlap_are_refused(
    tmp_path: Path, inbox: str, outbox: str
) -> None:
    """``--inbox X --outbox X`` (or one inside the other): a manifest named ``done.csv``
    wrote its outputs into the inbox's ``done/``, an inbox inside the outbox took a
    manifest's ``results.jsonl`` for a manifest of its own. Refused at start: exit 2, one
    line naming both, nothing written."""
    (tmp_path / "box" / "in").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "box")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "daemon",
            "--inbox",
            str(tmp_path / inbox),
            "--outbox",
            str(tmp_path / outbox),
            "--state",
            str(tmp_path / "d.state"),
            "--listen",
            "",
        ],
        capture_output=True,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "inbox and outbox must be separate folders" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "d.state").exists()
    assert sorted(p.name for p in (tmp_path / "box").iterdir()) == ["in"]
