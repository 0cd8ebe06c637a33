"""A run resumed with other flags than the attempt that began it (a cron line edited between
nights, a failing run "fixed" by changing a flag): resumed exactly once, or refused with what
to give, never a silent change that loses rows or bills them twice.

Found by a hunt: ``--base-url`` changed on a resume (a staging URL, a new region) had every
row of the run's live tasks sent, and billed, again to the new service, which did not know
the tasks, with exit 0; another account's key, at the same URL, did the same under it.
``--sink`` changed on a resume was refused as a results file rewritten by
another run (the SQLite sink's row checkpoint read as a byte count), or as a file that is not a
database, with ``--restart`` (every row billed again) or another ``--out`` as the way out.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.engine.service_check import service_text
from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, dead_port, ids_of, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour, misbehaving

N = 1000


def _committed(out: Path, sink: str) -> int:
    """Results lines (or SQLite rows) in ``out`` now."""
    if sink == "jsonl":
        return out.read_bytes().count(b"\n") if out.exists() else 0
    try:
        with contextlib.closing(sqlite3.connect(out)) as db:
            return int(db.execute("SELECT count(*) FROM results").fetchone()[0])
    except sqlite3.Error:
        return 0


def _checkpointed(out: Path) -> int:
    """The results the run's state counts as committed (its sink may hold more: they are
    written before the state's commit that counts them)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{out}.state")) as db:
            return int(db.execute("SELECT max(results_ckpt) FROM jobs").fetchone()[0] or 0)
    except sqlite3.Error:
        return 0


async def _killed_once_results_are_committed(args: list[str], out: Path, sink: str) -> None:
    await _killed_once(args, lambda: _committed(out, sink) > 0 and _checkpointed(out) > 0)


def _sqlite_to_jsonl(out: Path) -> None:
    """The SQLite results as JSONL lines beside them, for :func:`assert_exactly_once`."""
    with contextlib.closing(sqlite3.connect(out)) as db:
        ids = [r[0] for r in db.execute("SELECT id FROM results")]
    lines = "".join(
        f'{{"id":"{i}","taskId":"t","taggingResult":{{"status":"success"}}}}\n' for i in ids
    )
    out.with_suffix(".lines").write_text(lines)


@pytest.mark.parametrize(("begun", "resumed"), [("jsonl", "sqlite"), ("sqlite", "jsonl")])
async def test_a_resume_with_another_sink_is_refused_naming_the_sink_it_was_begun_with(
    tmp_path: Path, begun: str, resumed: str
) -> None:
    manifest = write_csv(tmp_path / "m.csv", N)
    out, rej = tmp_path / "out.res", tmp_path / "out.rej"
    async with running_service(ServiceConfig(rate=400.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--rotate-images", "200")
        args += ["--rotate-min-images", "200"]
        await _killed_once_results_are_committed([*args, "--sink", begun], out, begun)
        with anyio.fail_after(30):
            other = await anyio.run_process([*args, "--sink", resumed], check=False, env=ENV)
        err = other.stderr.decode()
        assert other.returncode == 2, err
        assert f"begun with --sink {begun}" in err and "--restart" not in err, err
        with anyio.fail_after(30):
            done = await anyio.run_process([*args, "--sink", begun], check=False, env=ENV)
        assert done.returncode == 0, done.stderr.decode()
        assert svc.store.image_count == N  # no row billed twice
    if begun == "sqlite":
        _sqlite_to_jsonl(out)
        out = out.with_suffix(".lines")
    assert_exactly_once(out, rej, ids_of(N))


async def _killed_once(args: list[str], reached: Callable[[], bool]) -> None:
    """The run of ``args`` killed (SIGKILL) once ``reached()`` says so, before it ended."""
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    with anyio.fail_after(30):
        while not reached() and proc.returncode is None:
            await anyio.sleep(0.01)
    assert proc.returncode is None, "the run ended before it was killed"
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.aclose()


async def _killed_once_every_row_is_sent(args: list[str], svc: RunningService, n: int) -> None:
    await _killed_once(args, lambda: svc.store.image_count >= n)


@pytest.mark.parametrize("elsewhere", ["another service", "the same one by another name"])
async def test_a_resume_against_another_service_is_refused_before_a_row_is_billed_there(
    tmp_path: Path, elsewhere: str
) -> None:
    """``--base-url`` changed on a resume (a staging URL, a new region): the run's tasks are
    unknown there, and every row in them was sent to the new service too (billed on both,
    exit 0). A URL that reaches the same service (a proxy, a new name) resumes as before."""
    manifest = write_csv(tmp_path / "m.csv", N)
    out, rej = tmp_path / "out.jsonl", tmp_path / "out.rej"
    extra = [str(manifest), "--rotate-images", "200", "--rotate-min-images", "200"]
    async with (
        running_service(ServiceConfig(rate=400.0)) as first,
        running_service(ServiceConfig()) as other,
        misbehaving(first.url, Misbehaviour()) as proxy,
    ):
        await _killed_once_every_row_is_sent(run_args(first.url, out, *extra), first, N)
        url = other.url if elsewhere == "another service" else proxy.url
        with anyio.fail_after(30):
            again = await anyio.run_process(run_args(url, out, *extra), check=False, env=ENV)
        err = again.stderr.decode()
        if elsewhere == "another service":
            assert again.returncode == 2, err
            assert f"--base-url {first.url}" in err, err
            assert other.store.image_count == 0  # nothing sent (billed) there
            with anyio.fail_after(30):
                again = await anyio.run_process(
                    run_args(first.url, out, *extra), check=False, env=ENV
                )
        assert again.returncode == 0, again.stderr.decode()
        assert first.store.image_count == N and other.store.image_count == 0
    assert_exactly_once(out, rej, ids_of(N))


async def test_a_resume_on_another_service_once_the_first_is_gone_goes_on_there(
    tmp_path: Path,
) -> None:
    """The first service is gone for good (a region shut down: no connection): refusing the
    new URL left ``--restart`` (every row billed again) as the only way on. The run resumes on
    the service given now, its live tasks' rows sent there, as for tasks a service forgot."""
    manifest = write_csv(tmp_path / "m.csv", N)
    out, rej = tmp_path / "out.jsonl", tmp_path / "out.rej"
    extra = [str(manifest), "--rotate-images", "200", "--rotate-min-images", "200"]
    async with running_service(ServiceConfig()) as other:
        async with running_service(ServiceConfig(rate=400.0)) as first:
            await _killed_once_every_row_is_sent(run_args(first.url, out, *extra), first, N)
        with anyio.fail_after(60):
            again = await anyio.run_process(run_args(other.url, out, *extra), check=False, env=ENV)
        assert again.returncode == 0, again.stderr.decode()
        assert 0 < other.store.image_count <= N
    assert_exactly_once(out, rej, ids_of(N))


async def test_a_resume_that_could_not_reach_another_service_is_refused_there_later(
    tmp_path: Path,
) -> None:
    """A resume given another URL whose service could not be asked (down that night: no
    answer) went on and failed on it (exit 1), but recorded that URL as the run's: the next
    resume there, the service up, asked nothing and sent every row of the run's live tasks
    to it (billed on both, exit 0). The URL is the run's only once that service knew a task
    (or the first one is gone): until then each resume asks again."""
    manifest = write_csv(tmp_path / "m.csv", N)
    out, rej = tmp_path / "out.jsonl", tmp_path / "out.rej"
    extra = [str(manifest), "--rotate-images", "200", "--rotate-min-images", "200"]
    async with (
        running_service(ServiceConfig(rate=400.0)) as first,
        running_service(ServiceConfig()) as other,
        MisbehavingProxy(f"http://127.0.0.1:{dead_port()}", Misbehaviour()).running() as proxy,
    ):
        await _killed_once_every_row_is_sent(run_args(first.url, out, *extra), first, N)
        args = run_args(proxy.url, out, *extra, "--give-up-after", "1")
        with anyio.fail_after(30):
            down = await anyio.run_process(args, check=False, env=ENV)
        assert down.returncode == 1, down.stderr.decode()
        proxy.upstream = other.url  # that service is up the next night
        with anyio.fail_after(30):
            again = await anyio.run_process(args, check=False, env=ENV)
        err = again.stderr.decode()
        assert again.returncode == 2, err
        assert f"--base-url {first.url}" in err, err
        assert other.store.image_count == 0  # nothing sent (billed) there
        with anyio.fail_after(30):
            done = await anyio.run_process(run_args(first.url, out, *extra), check=False, env=ENV)
        assert done.returncode == 0, done.stderr.decode()
        assert first.store.image_count == N and other.store.image_count == 0
    assert_exactly_once(out, rej, ids_of(N))


def test_the_service_is_recorded_without_its_user_part() -> None:
    for url in ("https://u:s3cret@gw.example/tag/", "https://s3cret@gw.example/tag"):
        assert service_text(url) == "https://gw.example/tag"
    assert service_text("https://u:s3c/ret@gw.example") == "https://gw.example"


async def test_a_resume_with_another_accounts_key_is_refused_before_a_row_is_billed_to_it(
    tmp_path: Path,
) -> None:
    """The key changed on a resume (another account's, at the same URL): the run's tasks are
    404 to it, and every row in them was sent again under it (billed to both accounts, exit
    0). Neither key shows in the message or the state."""
    keys = ("bulk-key-of-account-one", "bulk-key-of-account-two")
    manifest = write_csv(tmp_path / "m.csv", N)
    out, rej = tmp_path / "out.jsonl", tmp_path / "out.rej"
    extra = [str(manifest), "--rotate-images", "200", "--rotate-min-images", "200"]
    env = [{**ENV, "FASHIONTAG_BULK_API_KEY": key, "FASHIONTAG_API_KEY": key} for key in keys]
    async with running_service(ServiceConfig(rate=400.0, bulk_api_keys=keys)) as svc:
        args = run_args(svc.url, out, *extra)
        proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=env[0])
        with anyio.fail_after(30):
            while svc.store.image_count < N and proc.returncode is None:
                await anyio.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        with anyio.fail_after(30):
            again = await anyio.run_process(args, check=False, env=env[1])
        err = again.stderr.decode()
        assert again.returncode == 2, err
        assert "FASHIONTAG_BULK_API_KEY" in err and not any(key in err for key in keys), err
        assert svc.store.image_count == N  # nothing sent (billed) under the other key
        with anyio.fail_after(30):
            done = await anyio.run_process(args, check=False, env=env[0])
        assert done.returncode == 0, done.stderr.decode()
        assert svc.store.image_count == N
    state = out.with_name(out.name + ".state").read_bytes()
    assert not any(key.encode() in state for key in keys)
    assert_exactly_once(out, rej, ids_of(N))


async def test_a_resume_on_another_service_after_a_create_unanswered_bills_nothing_there(
    tmp_path: Path,
) -> None:
    """Killed while its create's answer was on its way (applied by the service, recorded by
    the run only by its token), then resumed with another ``--base-url``: the state held no
    task to ask the new service about, so the run went on there, did not find the create's
    task and sent its rows again: billed on both services, ``resent`` 0, exit 0. The first
    service is asked for the creates' tokens: it holds their task, so the resume is refused,
    and resumed where it was begun, the task is adopted and nothing is sent twice."""
    n = 300
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    extra = [str(manifest), "--rotate-images", "300", "--rotate-min-images", "300"]
    async with (
        running_service(ServiceConfig(rate=400.0)) as first,
        running_service(ServiceConfig()) as other,
        misbehaving(first.url, Misbehaviour(hold_first_create=True)) as proxy,
    ):
        # Killed once the create is applied, its answer held by the proxy.
        await _killed_once(run_args(proxy.url, out, *extra), lambda: bool(first.store.tasks))
        with anyio.fail_after(60):
            again = await anyio.run_process(run_args(other.url, out, *extra), check=False, env=ENV)
        err = again.stderr.decode()
        assert again.returncode == 2, err
        assert f"--base-url {proxy.url}" in err, err
        assert other.store.image_count == 0  # nothing sent (billed) there
        with anyio.fail_after(60):
            again = await anyio.run_process(run_args(proxy.url, out, *extra), check=False, env=ENV)
        assert again.returncode == 0, again.stderr.decode()
        assert first.store.image_count == n and other.store.image_count == 0
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
