"""Bad numbers in the config file and the flags, as a user gives them to the real CLI: each is
exit 2 with one line naming the setting, before anything is made (DESIGN 4.1 exit codes), not
a traceback mid-run, a hang, or a setting silently read as something else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, dead_port, run_args, write_csv

CLIENT_VALUES = [
    # inf: aiohttp's timer did ceil(inf), an OverflowError traceback once the state was made
    ("[client.limits]\nkeepalive_expiry = inf", (), "keepalive_expiry"),
    # read by aiohttp as "no limit": a frozen service held the run for ever
    ("[client.timeout]\nread = -1.0", (), "timeout.read"),
    ("[client.timeout]\nconnect = nan", (), "timeout.connect"),
    ("[client.timeout]\ntotal = 0.0", (), "timeout.total"),
    # nan: idle connections never expire, writes go on stale ones (of unknown fate)
    ("[client.limits]\nkeepalive_expiry = nan", (), "keepalive_expiry"),
    ("[client.retry]\nbackoff_max = nan", (), "retry"),
    ("[client.retry]\nbackoff_base = inf", (), "retry"),
    ("[client.retry]\nmax_retry_after = nan", (), "retry"),
]

ENGINE_VALUES = [
    ("", ("--linger", "nan"), "linger_seconds"),  # a partial chunk waited for ever: a hang
    ("", ("--progress-interval", "nan"), "progress_seconds"),  # a traceback mid-run
    ("[engine]\nqueue_batches = -1", (), "queue_batches"),  # a traceback mid-run
    ("[engine]\nread_batch_rows = 0", (), "read_batch_rows"),
    ("", ("--expiry-margin", "nan"), "expiry_margin"),  # one task per chunk, silently
    ("", ("--expiry-margin", "inf"), "expiry_margin"),
    ("", ("--rotate-seconds", "nan"), "rotate_seconds"),  # a task never sealed by age
    ("[engine]\nfsync_seconds = nan", (), "fsync_seconds"),  # never fsync-ed
    ("[engine]\nfsync_seconds = -1.0", (), "fsync_seconds"),
    ("[engine]\nreuse_max_age = nan", (), "reuse_max_age"),  # no stored result ever reused
    # "": exit 1 naming a store "." it cannot open; "  ": a store made as a file named "  "
    ("[engine]\npoll_min = inf\npoll_max = inf", (), "poll_min"),  # never polled: 2 h, exit 1
    ("[engine]\npoll_max = inf", (), "poll_max"),  # backed off without a bound in an outage
    ('[engine]\nreuse = ""', (), "engine.reuse"),
    ('[engine]\nreuse = "  "', (), "engine.reuse"),
    # a reader task was started per slot: 10**12 of them took every byte of memory (OOM kill)
    ("", ("--page-concurrency", "1000000000000"), "max_page_concurrency"),
]


@pytest.mark.parametrize(("config", "flags", "named"), CLIENT_VALUES + ENGINE_VALUES)
def test_a_bad_number_is_exit_2_naming_it_before_anything_is_made(
    tmp_path: Path, config: str, flags: tuple[str, ...], named: str
) -> None:
    manifest = write_csv(tmp_path / "m.csv", 3)
    settings = tmp_path / "c.toml"
    settings.write_text(config + "\n")
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "fashiontag_pipeline", "run", str(manifest), "--out", str(out)]
    argv += ["--base-url", f"http://127.0.0.1:{dead_port()}", "--no-progress"]
    argv += ["--config", str(settings), "--give-up-after", "1", *flags]
    result = subprocess.run(argv, capture_output=True, env=ENV, timeout=20, check=False)
    err = result.stderr.decode()
    assert "Traceback" not in err, err[-600:]
    assert result.returncode == 2, (result.returncode, err[-600:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fashiontag: "), err
    assert named in lines[0], lines[0]
    assert not out.with_name("out.jsonl.state").exists()


@pytest.mark.parametrize("timeout", ["read", "total", "connect"])
async def test_an_infinite_timeout_is_no_limit(tmp_path: Path, timeout: str) -> None:
    """TOML has no None: ``inf`` is how a file says "no limit". aiohttp's timer did ceil(inf):
    an OverflowError traceback once the run had made its state (and in ``tasks``, ``tag``)."""
    manifest = write_csv(tmp_path / "m.csv", 3)
    settings = tmp_path / "c.toml"
    settings.write_text(f"[client.timeout]\n{timeout} = inf\n")
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig(rate=0.0)) as svc:
        run = run_args(svc.url, out, str(manifest), "--config", str(settings))
        tasks = [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list"]
        tasks += ["--base-url", svc.url, "--config", str(settings)]
        for argv in (run, tasks):
            result = await anyio.run_process(argv, check=False, env=ENV)
            err = result.stderr.decode()
            assert "Traceback" not in err and result.returncode == 0, err[-600:]
    assert len(out.read_text().splitlines()) == 3


async def test_rotate_images_below_the_chunk_size_caps_each_task(tmp_path: Path) -> None:
    """``--rotate-images 500`` ("a task holds at most N images") made tasks of 1,000: a chunk
    of ``chunk_size`` (1,000) rows went whole to a task. Chunks are no larger than the cap."""
    manifest = write_csv(tmp_path / "m.csv", 2500)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig(rate=0.0)) as svc:
        args = run_args(svc.url, out, str(manifest), "--rotate-images", "500")
        result = await anyio.run_process(args, check=False, env=ENV)
        sizes = sorted(len(task.ids) for task in svc.store.tasks.values())
    assert result.returncode == 0, result.stderr.decode()[-600:]
    assert len(out.read_text().splitlines()) == 2500
    assert sizes == [500] * 5, sizes


def test_restart_and_resume_together_are_refused(tmp_path: Path) -> None:
    """``--restart`` (discard the state) with ``--resume`` (resume the unfinished stdin run it
    holds) was taken, --restart winning without a word: the run the user meant to resume was
    discarded and every row tagged (billed) again. Exit 2 naming both."""
    manifest = write_csv(tmp_path / "m.csv", 3)
    out = tmp_path / "out.jsonl"
    argv = run_args(f"http://127.0.0.1:{dead_port()}", out, str(manifest), "--give-up-after", "1")
    result = subprocess.run(
        [*argv, "--restart", "--resume"], capture_output=True, env=ENV, timeout=30
    )
    err = result.stderr.decode()
    assert result.returncode == 2, err[-600:]
    assert "--restart" in err and "--resume" in err and "not allowed with" in err, err
    assert not out.with_name("out.jsonl.state").exists()
