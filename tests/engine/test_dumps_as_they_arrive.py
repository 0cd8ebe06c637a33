"""Manifests as nightly dumps really arrive (each test failed before its fix): a dump
replaced while the run starts, identities SQLite's JSON functions cut short, and a CSV saved
with old Mac line ends (bare CR)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import pytest

from fashiontag_pipeline.engine.source import iter_rows_sync, open_manifest
from fashiontag_pipeline.engine.validate import Validator
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, dead_port, read_outcomes, run_args, write_csv

#: A manifest large enough that hashing it takes a while (as a real nightly dump does: a
#: 10^7-row dump takes seconds): 1,000 rows, each with an ignored 64 KB column.
_PAD = "z" * 64_000


def _big(prefix: str, n: int) -> str:
    return "id,url,pad\n" + "".join(
        f"{prefix}{i},https://img.example/{prefix}{i}.jpg,{_PAD}\n" for i in range(n)
    )


def _small(prefix: str, n: int) -> str:
    return "id,url,pad\n" + "".join(
        f"{prefix}{i},https://img.example/{prefix}{i}.jpg,x\n" for i in range(n)
    )


def _replace_once_open(pid: int, path: Path, new: Path, deadline: float) -> bool:
    """Rename ``new`` over ``path`` as soon as process ``pid`` has ``path`` open (its first
    look at the manifest: the fingerprint, which hashes the whole file). The exporter's
    ``write tmp; mv tmp dump.csv``. True when it saw the file open."""
    fds = Path(f"/proc/{pid}/fd")
    seen = False
    while not seen and time.monotonic() < deadline:
        try:
            for fd in fds.iterdir():
                try:
                    if os.readlink(fd) == str(path):
                        seen = True
                        break
                except OSError:
                    pass
        except OSError:
            break  # the process is gone
        if not seen:
            time.sleep(0.0005)
    os.rename(new, path)
    return seen


async def _run_while_replaced(
    args: list[str], manifest: Path, tonight: Path
) -> tuple[bool, int, str]:
    """``fashiontag run`` (reniced), with ``tonight`` renamed over ``manifest`` the moment the
    run has it open: (whether the rename landed then, the exit code, stderr)."""
    proc = subprocess.Popen(
        args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_nice
    )
    try:
        seen = await anyio.to_thread.run_sync(
            _replace_once_open, proc.pid, manifest, tonight, time.monotonic() + 30
        )
        with anyio.fail_after(60):
            while proc.poll() is None:
                await anyio.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    proc.stderr.close()
    return seen, proc.returncode, err


def _nice() -> None:
    os.nice(10)  # the run goes a little slower than the exporter standing in for cron's race


async def test_a_dump_replaced_while_a_resume_starts_is_never_resumed_by_line_numbers(
    tmp_path: Path,
) -> None:
    """Last night's run stopped unfinished (the service was down). Tonight the exporter
    replaces the dump (``mv tmp dump.csv``) while the resume is hashing it: the fingerprint is
    of the old file, which matches the state, so the run resumes; but the rows are read from
    the new file opened afterwards, and its first lines are skipped as if the old rows there
    were its own. Exit 0, "complete", with two thirds of the new dump never tagged and the
    outputs mixing two dumps."""
    manifest = tmp_path / "dump.csv"
    manifest.write_text(_big("a", 1000))
    tonight = tmp_path / "dump.csv.tmp"
    tonight.write_text(_small("b", 1500))
    out = tmp_path / "results.jsonl"
    state = ["--state", str(tmp_path / "s.db"), "--linger", "0.2"]

    dead = f"http://127.0.0.1:{dead_port()}"
    first = await anyio.run_process(
        run_args(dead, out, str(manifest), *state, "--give-up-after", "1"), check=False, env=ENV
    )
    assert first.returncode == 1, first.stderr.decode()[-400:]

    async with running_service(ServiceConfig()) as svc:
        seen, code, err = await _run_while_replaced(
            run_args(svc.url, out, str(manifest), *state), manifest, tonight
        )
    assert seen
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    ids = [r["id"] for r in outcomes.results] + [r["id"] for r in outcomes.rejects]
    kinds = {i[0] for i in ids}
    # Whatever the run read, it is one dump: resumed (the old one, every row once) or refused.
    assert len(kinds) <= 1, (
        f"exit {code}: outputs mix two dumps ({sum(i[0] == 'a' for i in ids)} rows of"
        f" the old one, {sum(i[0] == 'b' for i in ids)} of the new one); {err[-300:]}"
    )
    if code in (0, 3):
        (kind,) = kinds
        expected = {f"{kind}{i}" for i in range(1000 if kind == "a" else 1500)}
        assert sorted(ids) == sorted(expected)
        # The old dump tagged whole, tonight's at the path is not: said, never exit 0.
        assert (code == 3) == (kind == "a"), err[-400:]
        assert code == 0 or "names another file" in err, err[-400:]
    else:  # refused: the state is of another dump, and it says so
        assert code == 2, err[-400:]


async def test_a_dump_replaced_while_a_run_starts_records_what_it_read(tmp_path: Path) -> None:
    """The exporter's ``mv`` lands while a run hashes the dump: the run reads and tags the new
    file but records the old one's size and SHA-256. The same command again on the very file
    it tagged (a cron retry, an operator making sure) says the manifests changed, starts a new
    run and sends, and bills, every row again."""
    manifest = tmp_path / "dump.csv"
    manifest.write_text(_big("a", 1000))
    tonight = tmp_path / "dump.csv.tmp"
    tonight.write_text(_small("b", 300))
    out = tmp_path / "results.jsonl"
    summary = tmp_path / "summary.json"
    args = ["--state", str(tmp_path / "s.db"), "--linger", "0.2", "--summary", str(summary)]
    async with running_service(ServiceConfig()) as svc:
        seen, code, err = await _run_while_replaced(
            run_args(svc.url, out, str(manifest), *args), manifest, tonight
        )
        assert seen
        first = read_outcomes(out, out.with_suffix(".rej"))
        read_new = code == 0 and first.ids and first.ids[0].startswith("b")
        again = await anyio.run_process(
            run_args(svc.url, out, str(manifest), *args), check=False, env=ENV
        )
    assert again.returncode == 0, again.stderr.decode()[-400:]
    sent_again = json.loads(summary.read_text())["submitted"]
    if read_new:  # the first run tagged this very file: nothing is left to send
        assert sent_again == 0, (
            f"the first run tagged the file now at {manifest.name}, and the same command sent"
            f" {sent_again} of its rows again: {again.stderr.decode()[-300:]} (first: {err})"
        )


async def test_an_id_with_a_nul_does_not_make_another_id_a_duplicate(tmp_path: Path) -> None:
    """Run-wide dedupe inserts a batch's ids through SQLite's ``json_each``, which ends a key
    at an escaped NUL: ``a\\u0000b`` is recorded as ``a``, and a later row whose id really is
    ``a`` becomes a ``duplicate id (first seen at ... line 1)`` reject. That row is never
    tagged; the run exits 0."""
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"id": "sku-1\u0000v2", "url": "https://img.example/1.jpg"},
        {"id": "sku-1", "url": "https://img.example/2.jpg"},
        {"id": "sku-2", "url": "https://img.example/3.jpg"},
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            run_args(svc.url, out, str(manifest)), check=False, env=ENV
        )
    assert result.returncode == 0, result.stderr.decode()[-400:]
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    duplicates = [r for r in outcomes.rejects if r["reason"].startswith("duplicate id")]
    assert not duplicates, duplicates
    assert "sku-1" in outcomes.ids


def test_a_csv_with_bare_cr_line_ends_is_streamed_not_read_whole(tmp_path: Path) -> None:
    """Excel for Mac's "CSV (Macintosh)" ends lines with a bare CR. The source cuts its reads
    at the last LF, finds none, and keeps every byte pending until the end of the file: the
    whole manifest in memory (and copied again on every 1 MiB read, quadratic), no row before
    the last byte (on stdin: nothing sent while the producer writes). A 1M-row dump peaked at
    319 MB against 43 MB with LF ends."""
    manifest = tmp_path / "mac.csv"
    rows = "".join(f"g{i},https://img.example/{i}.jpg\r" for i in range(300_000))
    manifest.write_bytes(("id,url\r" + rows).encode())
    size = manifest.stat().st_size
    reader = open_manifest(str(manifest), 0)
    try:
        batch = reader.read_batch()
        assert batch is not None and batch.rows
        _, first = next(iter(batch.rows))
        assert first == ["g0", "https://img.example/0.jpg"]
        read_before_first_batch = reader.bytes_read
    finally:
        reader.close()
    assert read_before_first_batch <= 4 << 20, (
        f"{read_before_first_batch:,} of {size:,} bytes read (and held) before the first rows"
    )


async def test_an_id_with_a_nul_in_a_postgresql_state_is_one_clear_outcome(
    tmp_path: Path, postgres_url: str
) -> None:
    """PostgreSQL text cannot hold a NUL: with ``--state postgresql://`` a row whose id holds
    one must not stop the run (every night the same); it gets one outcome, and the other rows
    theirs."""
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"id": "sku-1\u0000v2", "url": "https://img.example/1.jpg"},
        {"id": "sku-1", "url": "https://img.example/2.jpg"},
        {"id": "sku-2", "url": "https://img.example/3.jpg"},
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    state = f"{postgres_url}#nul_ids"
    async with running_service(ServiceConfig()) as svc:
        args = [*run_args(svc.url, out, str(manifest)), "--state", state]
        result = await anyio.run_process(args, check=False, env=ENV)
    assert result.returncode == 0, result.stderr.decode()[-600:]
    outcomes = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(r["id"] for r in outcomes.results) == ["sku-1", "sku-2"]
    (reject,) = outcomes.rejects
    assert reject["id"] == "sku-1\u0000v2" and reject["reason"] == "id contains a NUL character"
    assert reject["stage"] == "client" and reject["line"] == 1


@pytest.mark.parametrize("fmt", ["csv", "csv-block", "jsonl"])
def test_an_id_with_a_nul_is_a_client_reject_in_every_format(tmp_path: Path, fmt: str) -> None:
    """The same outcome whichever path a row takes through validation (a block of plain
    ``id,url`` lines, a CSV row with context columns, a JSONL line)."""
    if fmt == "jsonl":
        text = '{"id": "a\\u0000b", "url": "https://x.example/1.jpg"}\n'
        text += '{"id": "c", "url": "https://x.example/2.jpg"}\n'
    elif fmt == "csv":
        text = "id,url,brand\na\x00b,https://x.example/1.jpg,acme\nc,https://x.example/2.jpg,acme\n"
    else:
        text = "id,url\na\x00b,https://x.example/1.jpg\nc,https://x.example/2.jpg\n"
    path = tmp_path / ("m.jsonl" if fmt == "jsonl" else "m.csv")
    path.write_text(text)
    reader = open_manifest(str(path), 0)
    try:
        batch = reader.read_batch()
    finally:
        reader.close()
    assert batch is not None
    items, _, rejects = Validator().route(batch)
    assert [i[0] for i in items] == ["c"]
    assert [(r.id, r.reason, r.line) for _, r in rejects] == [
        ("a\x00b", "id contains a NUL character", 2 if fmt != "jsonl" else 1)
    ]


async def test_rows_appended_after_the_dump_was_read_are_not_reported_complete(
    tmp_path: Path,
) -> None:
    """An exporter still appending to tonight's dump when cron starts the run: the reader
    reaches the end of the file within a second and the run then tags for minutes. A row
    appended meanwhile was never read, never tagged, and the run exited 0 'complete'. It
    ends with exit 3 (rows without an outcome), says on stderr which manifest changed and
    what to run, and the summary says so; the same command again tags the whole file."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "results.jsonl"
    summary = tmp_path / "summary.json"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(tmp_path / "s.db"))
        args += ["--summary", str(summary)]

        def append() -> None:
            with manifest.open("a") as fh:
                fh.write("late-1,https://img.example/late-1.jpg,acme,TOP\n")

        code, err = await _changed_while_tagged(args, out, append)
        assert "late-1" not in read_outcomes(out, out.with_suffix(".rej")).ids
        assert code == 3, err[-600:]
        assert str(manifest) in err and "not tagged" in err and "run complete" not in err
        assert "rows appended after the read were not tagged" in err, err[-600:]
        assert "run the same command again" in err, err[-600:]
        report = json.loads(summary.read_text())
        assert report["complete"] is False and str(manifest) in report["error"]
        with anyio.fail_after(60):
            again = await anyio.run_process(args, check=False, env=ENV)
    assert again.returncode == 0, again.stderr.decode()[-600:]
    assert "late-1" in read_outcomes(out, out.with_suffix(".rej")).ids


async def test_a_dump_cut_after_it_was_read_is_not_said_to_have_rows_written_after(
    tmp_path: Path,
) -> None:
    """A dump cut (made shorter: an exporter that starts over, a cleanup job) after the run
    read it to its end: the run ended with exit 3 saying 'rows written after the run read it
    were not tagged', yet nothing was written after; the file changed. It still ends with
    exit 3, and says the file at the path is no longer the one tagged."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(tmp_path / "s.db"))
        code, err = await _changed_while_tagged(
            args, out, lambda: os.truncate(manifest, manifest.stat().st_size // 2)
        )
    assert code == 3, err[-600:]
    assert f"manifest {manifest} was cut" in err, err[-600:]
    assert "no longer the one tagged" in err, err[-600:]
    assert "written after" not in err and "appended" not in err, err[-600:]


def test_a_dump_renamed_over_after_it_was_read_is_told_and_stdin_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-of-run look at a manifest: grown, cut, or another file at its path (the
    exporter's ``mv``) is described; the file as read, or stdin, is not."""
    path = tmp_path / "m.csv"
    path.write_text(_small("a", 3))
    reader = open_manifest(str(path), 0)
    try:
        list(iter_rows_sync(reader))
        assert reader.changed_since_read() is None
        (tmp_path / "next.csv").write_text(_small("b", 3))
        os.replace(tmp_path / "next.csv", path)
        replaced = reader.changed_since_read() or ""
        assert "another file" in replaced and "no longer the one tagged" in replaced
        assert "appended" not in replaced
    finally:
        reader.close()
    with path.open("rb") as stdin:  # ``fashiontag run - < m.csv``: no path to look at
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        reader = open_manifest("-", 0)
        try:
            list(iter_rows_sync(reader))
            with path.open("a") as fh:
                fh.write("late,https://img.example/late.jpg\n")
            assert reader.changed_since_read() is None
        finally:
            reader.close()


async def _changed_while_tagged(
    args: list[str], out: Path, change: Callable[[], object]
) -> tuple[int | None, str]:
    """Run ``args``; once its results flow (every row was read long before), ``change`` the
    dump; (its exit code, its stderr)."""
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    with anyio.fail_after(60):
        while (not out.exists() or out.stat().st_size == 0) and proc.returncode is None:
            await anyio.sleep(0.02)
    assert proc.returncode is None, "the run ended before the dump was changed"
    change()
    with anyio.fail_after(60):
        err = (await _all_of(proc.stderr)).decode(errors="replace")
        await proc.wait()
    await proc.aclose()
    return proc.returncode, err


async def _all_of(stream: anyio.abc.ByteReceiveStream | None) -> bytes:
    assert stream is not None
    chunks = []
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
        while True:
            chunks.append(await stream.receive())
    return b"".join(chunks)


async def test_a_dump_exported_again_unchanged_after_it_was_read_is_complete(
    tmp_path: Path,
) -> None:
    """An exporter that writes the dump every few minutes (``write tmp; mv tmp dump.csv``),
    or a sync tool re-copying it, puts the same bytes under another inode while the run tags:
    every row was read and tagged. It ended with exit 3, 'rows written after the run read it
    were not tagged' and 'the same command again starts a new run', which then said 'already
    complete', exit 0. The same content at the path is no change: exit 0 at once."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(tmp_path / "s.db"))

        def export_again() -> None:
            (tmp_path / "m.csv.tmp").write_bytes(manifest.read_bytes())
            os.replace(tmp_path / "m.csv.tmp", manifest)

        code, err = await _changed_while_tagged(args, out, export_again)
    assert code == 0, err[-600:]
    assert "another file" not in err and "not tagged" not in err, err[-600:]
    assert len(read_outcomes(out, out.with_suffix(".rej")).ids) == 4000


async def test_a_dump_written_again_in_place_at_its_size_after_it_was_read_ends_with_exit_3(
    tmp_path: Path,
) -> None:
    """A dump rewritten in place after the run read it (a copy tool that set the file's size
    first and filled it later, a sync that writes over the file): the same size at the same
    inode, other bytes. A `stat` sees nothing but its modification time, and the run ended
    exit 0 'complete' for rows the file no longer holds. It ends with exit 3 naming the file
    (its modification time changed, so it is hashed at the end)."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "results.jsonl"
    async with running_service(ServiceConfig(rate=2000.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--state", str(tmp_path / "s.db"))

        def write_again() -> None:
            data = manifest.read_bytes().replace(b",acme,", b",ACME,")
            st = manifest.stat()
            with manifest.open("r+b") as fh:  # in place: the same inode and size
                fh.write(data)
            os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))

        code, err = await _changed_while_tagged(args, out, write_again)
    assert code == 3, err[-600:]
    assert str(manifest) in err and "run complete" not in err, err[-600:]
