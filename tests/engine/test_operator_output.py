"""What an operator sees from `fashiontag run`, driven as a user runs it: a subprocess whose
stderr is a pipe (cron, a log file) or a pseudo-terminal, against the reference service on
loopback (or a closed loopback port)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .helpers import dead_port
from .proxy import Misbehaviour, misbehaving

ENV = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def manifest(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "m.csv"
    path.write_text(
        "id,url\n" + "".join(f"sku-{i},https://img.example/{i}.jpg\n" for i in range(rows))
    )
    return path


async def fashiontag(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", *args], check=False, env=ENV, cwd=cwd
    )
    return result.returncode, result.stderr.decode()


async def test_an_unreachable_service_is_reported_at_once_with_how_long_it_is_tried(
    tmp_path: Path,
) -> None:
    url = f"http://127.0.0.1:{dead_port()}"
    args = [str(manifest(tmp_path, 3)), "--base-url", url, "--out", str(tmp_path / "o.jsonl")]
    code, err = await fashiontag("run", *args, "--give-up-after", "1")
    lines = err.splitlines()
    assert code == 1
    # The first line names what fails and for how long the run keeps trying; the run's
    # last line is the fatal error. Before, stderr held only that last line.
    assert "cannot connect to" in lines[0] and url in lines[0]
    assert "keeps trying for 1 s (--give-up-after)" in lines[0]
    assert lines[-1].startswith("fashiontag: ") and "unreachable for 1s" in lines[-1]
    assert not any(line.startswith("fashiontag: progress") for line in lines)


async def test_verbose_logs_every_retry(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{dead_port()}"
    args = [str(manifest(tmp_path, 3)), "--base-url", url, "--out", str(tmp_path / "o.jsonl")]
    code, err = await fashiontag("-v", "run", *args, "--give-up-after", "1")
    assert code == 1
    assert re.search(r"INFO fashiontag_pipeline\.client: .*cannot connect.*retry 2 of 5", err)
    # The client's own retries already went on past the 1 s give-up: the run stops at the
    # first failure they raise, naming what failed (no "will keep trying" first).
    assert re.search(r"for 1s: POST /tagger/v2\.12/bulk: cannot connect", err), err


async def test_a_refusing_service_is_reported_at_once(tmp_path: Path) -> None:
    faults = FaultSpec.parse("429=1:0.05s,seed=3")
    async with running_service(ServiceConfig(faults=faults)) as svc:
        args = [str(manifest(tmp_path, 3)), "--base-url", svc.url]
        code, err = await fashiontag(
            "run", *args, "--out", str(tmp_path / "o.jsonl"), "--give-up-after", "0.5"
        )
    first = err.splitlines()[0]
    assert code == 1
    assert "rate limited (HTTP 429, Retry-After 0.05 s)" in first
    assert "keeps trying for 0 s" in first or "keeps trying for 1 s" in first


async def test_a_create_answered_503_is_said_so_not_unreachable(tmp_path: Path) -> None:
    """Every create answered 503 (load shedding, Retry-After: 3600): the service answers, so
    neither the first warning nor the final error says it cannot be reached. Before: "cannot
    reach the service" and "service unreachable for 1s: ... service answered HTTP 503"."""
    rules = Misbehaviour(storm=503, storm_ops={"create"}, storm_retry_after="3600")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = [str(manifest(tmp_path, 3)), "--base-url", proxy.url]
        code, err = await fashiontag(
            "run", *args, "--out", str(tmp_path / "o.jsonl"), "--give-up-after", "1"
        )
    assert code == 1 and proxy.storm_answers > 0
    assert "cannot reach" not in err and "unreachable" not in err, err
    assert "HTTP 503" in err.splitlines()[-1], err


async def test_periodic_progress_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    async with running_service(ServiceConfig(rate=60)) as svc:  # ~1 s of tagging
        code, err = await fashiontag(
            "run",
            str(manifest(tmp_path, 60)),
            "--base-url",
            svc.url,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--progress-interval",
            "0.2",
            "--rotate-min-images",
            "20",
        )
    assert code == 0, err
    progress = [line for line in err.splitlines() if line.startswith("fashiontag: progress")]
    assert progress, err
    assert "read 60" in progress[-1] and "tasks live" in progress[-1]
    assert "rows done, ETA" in progress[-1]  # the manifest is a file: its size is known


def _run_on_a_terminal(argv: list[str], columns: int) -> tuple[int, str]:
    """Run with stderr on a pseudo-terminal ``columns`` wide; what the terminal shows."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**ENV, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=env
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                proc.kill()
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        code = proc.wait(timeout=60)
    return code, b"".join(chunks).decode("utf-8", "replace")


async def test_progress_line_on_a_terminal_fits_80_columns_with_percent_and_eta(
    tmp_path: Path,
) -> None:
    async with running_service(ServiceConfig(rate=100)) as svc:
        argv = [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "run",
            str(manifest(tmp_path, 150)),
            "--base-url",
            svc.url,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--rotate-min-images",
            "50",
        ]
        code, shown = await anyio.to_thread.run_sync(_run_on_a_terminal, argv, 200)
    assert code == 0, shown
    text = ANSI.sub("", shown)
    frames = [f for f in re.split(r"[\r\n]", text) if "%" in f and "/" in f]
    assert frames, text
    assert all(len(frame.rstrip()) <= 80 for frame in frames), frames
    assert any("ETA" in frame for frame in frames)
    assert "150/150" in frames[-1] and "100.0%" in frames[-1]


async def test_a_plain_url_list_is_a_manifest(tmp_path: Path) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text(
        "https://img.example/a.jpg\n\nhttps://img.example/b,c.jpg\r\nhttps://img.example/a.jpg\n"
    )
    async with running_service(ServiceConfig()) as svc:
        code, err = await fashiontag(
            "run", str(urls), "--base-url", svc.url, "--out", str(tmp_path / "o.jsonl")
        )
    assert code == 0, err
    results = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == [
        "https://img.example/a.jpg",
        "https://img.example/b,c.jpg",
    ]
    rejects = [json.loads(x) for x in (tmp_path / "o.rejects.jsonl").read_text().splitlines()]
    assert [(r["id"], r["line"]) for r in rejects] == [("https://img.example/a.jpg", 4)]
    assert rejects[0]["reason"].startswith("duplicate id")


async def test_demo_keeps_its_files_where_it_says(tmp_path: Path) -> None:
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", "demo", "--images", "5"],
        check=False,
        env={**ENV, "TMPDIR": str(tmp_path)},
    )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr
    match = re.search(r"files kept in (\S+):", out)
    assert match, out
    folder = Path(match.group(1))
    assert folder.parent == tmp_path
    assert len((folder / "results.jsonl").read_text().splitlines()) == 5
    assert (folder / "catalogue.csv").is_file()


async def test_no_progress_flag_prints_no_progress(tmp_path: Path) -> None:
    async with running_service(ServiceConfig(rate=60)) as svc:
        code, err = await fashiontag(
            "run",
            str(manifest(tmp_path, 30)),
            "--base-url",
            svc.url,
            "--out",
            str(tmp_path / "o.jsonl"),
            "--progress-interval",
            "0.1",
            "--no-progress",
        )
    assert code == 0 and "fashiontag: progress" not in err


async def test_two_of_the_runs_files_on_one_path_are_refused_before_anything(
    tmp_path: Path,
) -> None:
    """``--out`` and ``--rejects`` on one file (two sinks would overwrite each other's lines),
    or an output on the manifest or the state: a usage error naming both, nothing written."""
    m = manifest(tmp_path, 5)
    url = f"http://127.0.0.1:{dead_port()}"
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    for clash, names in (
        (["--out", str(out), "--rejects", str(out)], "--out and --rejects"),
        (["--out", str(m)], "--out and manifest"),
        (["--out", str(out), "--state", str(out)], "--out and --state"),
        (["--out", str(out), "--rejects", str(tmp_path / "." / "m.csv")], "--rejects and manifest"),
    ):
        code, err = await fashiontag("run", str(m), "--base-url", url, *clash, "--no-progress")
        assert code == 2, err
        assert f"{names} are the same file" in err
    assert not out.exists() and not state.exists()
    # A hard link is the same file under another name.
    linked = tmp_path / "linked.jsonl"
    out.write_bytes(b"")
    os.link(out, linked)
    code, err = await fashiontag(
        "run", str(m), "--base-url", url, "--out", str(out), "--rejects", str(linked)
    )
    assert code == 2 and "--out and --rejects are the same file" in err, err
    assert m.read_text().startswith("id,url\nsku-0,")


async def test_a_truncated_gzip_says_how_to_go_on_once_the_file_is_whole(tmp_path: Path) -> None:
    """A download cut short: the rows before the cut are taken in, the run stops (exit 1)
    saying what to do once the file is whole (the state holds a run of the cut file, which
    the whole file no longer matches); that command then tags every row once."""
    import gzip

    whole = gzip.compress(manifest(tmp_path, 5000).read_bytes())
    gz = tmp_path / "m.csv.gz"
    gz.write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        run = ("run", str(gz), "--base-url", svc.url, "--out", str(out), "--no-progress")
        code, err = await fashiontag(*run)
        assert code == 1 and "truncated gzip" in err
        assert "once the file is whole, run again with --restart" in err
        gz.write_bytes(whole)
        code, err = await fashiontag(*run)
        assert code == 2 and "--restart" in err
        code, err = await fashiontag(*run, "--restart")
        assert code == 0, err
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"sku-{i}" for i in range(5000))


async def test_a_stderr_reader_that_goes_away_does_not_stop_the_run(tmp_path: Path) -> None:
    """``fashiontag run ... 2>&1 | head -1``, or a log collector that died: the progress
    lines then meet a broken pipe, which used to stop the run (exit 1, no message). Stderr is
    only for people: once nobody reads it, the run goes on without it and ends as it would."""
    m = manifest(tmp_path, 3000)
    out = tmp_path / "o.jsonl"
    async with running_service(ServiceConfig(rate=1500)) as svc:
        command = (
            f"{sys.executable} -m fashiontag_pipeline run {m} --base-url {svc.url}"
            f" --out {out} --progress-interval 0.05 2>&1 | head -1; exit ${{PIPESTATUS[0]}}"
        )
        with anyio.fail_after(60):
            result = await anyio.run_process(["bash", "-c", command], check=False, env=ENV)
        code = result.returncode
    assert code == 0
    assert len(out.read_text().splitlines()) == 3000


async def test_a_run_with_its_standard_streams_closed_still_runs(tmp_path: Path) -> None:
    """A job started with stdin, stdout and stderr closed (``<&- >&- 2>&-``, some job
    runners): the event loop's own file descriptors take their numbers, which it refuses
    (an abort, exit 134). They are opened on /dev/null first."""
    m = manifest(tmp_path, 300)
    out = tmp_path / "o.jsonl"
    async with running_service(ServiceConfig()) as svc:
        command = (
            f"exec {sys.executable} -m fashiontag_pipeline run {m} --base-url {svc.url}"
            f" --out {out} <&- >&- 2>&-"
        )
        with anyio.fail_after(60):
            result = await anyio.run_process(["sh", "-c", command], check=False, env=ENV)
    assert result.returncode == 0
    assert len(out.read_text().splitlines()) == 300


async def test_a_manifest_that_is_a_pipe_is_refused_clearly_not_read_twice(
    tmp_path: Path,
) -> None:
    """``run <(cat m.csv)`` and a named FIFO: the run's fingerprint read the pipe to its end,
    then the reader found it empty ("manifest is empty", rows there); a FIFO blocked for
    ever. A pipe cannot be read twice as a resumable run needs: refused at once, saying to
    pass it on stdin."""
    m = manifest(tmp_path, 20)
    url = f"http://127.0.0.1:{dead_port()}"
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for source in (f"<(cat {m})", str(fifo)):
        command = (
            f"{sys.executable} -m fashiontag_pipeline run {source} --base-url {url}"
            f" --out {tmp_path / 'o.jsonl'} --no-progress"
        )
        with anyio.fail_after(30):
            done = await anyio.run_process(["bash", "-c", command], check=False, env=ENV)
        err = done.stderr.decode()
        assert done.returncode == 1, err
        assert "not a regular file" in err and "stdin" in err


async def test_stdin_given_twice_is_refused_plainly(tmp_path: Path) -> None:
    """``run - -``: the second reader found stdin read to its end and called the manifest
    "neither JSONL nor a CSV with a header"; it is refused for what it is."""
    url = f"http://127.0.0.1:{dead_port()}"
    code, err = await fashiontag("run", "-", "-", "--base-url", url, "--out", str(tmp_path / "o"))
    assert code == 1 and "stdin (-) can be given as a manifest only once" in err, err
