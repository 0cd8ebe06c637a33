"""Paths in a config file that start with ``~`` (``reuse = "~/fashiontag/reuse.sqlite"``,
``outbox = "~/outbox"``): TOML expands nothing, and they were taken literally, a folder named
``~`` made in whatever directory the command ran from. Found by a hunt; failed before its fix."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, run_args, write_csv


async def test_a_reuse_store_under_home_in_a_config_file_is_found_from_any_directory(
    tmp_path: Path,
) -> None:
    """``[engine] reuse = "~/reuse.sqlite"``: the first night's store was made in ``./~/``
    of the directory the run began in; a cron job (another directory) made an empty one of its
    own there, and every row was tagged and billed again. The store is the one in ``$HOME``."""
    home, here, there = tmp_path / "home", tmp_path / "here", tmp_path / "there"
    for folder in (home, here, there):
        folder.mkdir()
    manifest = write_csv(tmp_path / "m.csv", 20)
    config = tmp_path / "fashiontag.toml"
    config.write_text('[engine]\nreuse = "~/reuse.sqlite"\n')
    env = {**ENV, "HOME": str(home)}
    async with running_service(ServiceConfig()) as svc:
        for night, cwd in enumerate((here, there)):
            out = tmp_path / f"night{night}.jsonl"
            args = run_args(svc.url, out, str(manifest), "--config", str(config))
            args += ["--summary", str(tmp_path / f"night{night}.json")]
            done = await anyio.run_process(args, check=False, env=env, cwd=cwd)
            assert done.returncode == 0, done.stderr.decode()[-400:]
    assert (home / "reuse.sqlite").is_file()
    assert not (here / "~").exists() and not (there / "~").exists()
    second = json.loads((tmp_path / "night1.json").read_text())
    assert second["reused"] == 20 and second["submitted"] == 0, second


async def test_a_daemon_outbox_and_state_under_home_in_a_config_file_are_in_home(
    tmp_path: Path,
) -> None:
    """``[daemon] outbox = "~/outbox"`` and ``state = "~/daemon.sqlite"``: the daemon wrote
    its outputs and its state into ``./~/`` of its working directory (``/`` under systemd),
    where nobody looked, and a restart from another directory found no state (its manifests
    in flight tagged again). They are under ``$HOME``."""
    home, cwd, inbox = tmp_path / "home", tmp_path / "cwd", tmp_path / "inbox"
    for folder in (home, cwd, inbox):
        folder.mkdir()
    config = tmp_path / "daemon.toml"
    config.write_text(
        f'[daemon]\ninbox = "{inbox}"\noutbox = "~/outbox"\nstate = "~/daemon.sqlite"\n'
        'listen = ""\nsettle = 0.2\nscan_interval = 0.2\n'
    )
    write_csv(inbox / "m.csv", 5)
    async with running_service(ServiceConfig()) as svc:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "fashiontag_pipeline", "daemon", "--config", str(config)),
                *("--base-url", svc.url, "--log-format", "json"),
            ],
            env={**ENV, "HOME": str(home)},
            cwd=cwd,
            stderr=subprocess.PIPE,
        )
        try:
            summary = home / "outbox" / "m" / "summary.json"
            deadline = time.monotonic() + 20
            while not summary.exists() and time.monotonic() < deadline and proc.poll() is None:
                await anyio.sleep(0.1)
        finally:
            proc.terminate()
            _, err = await anyio.to_thread.run_sync(proc.communicate, None, 30)
    assert summary.exists(), err.decode()[-600:]
    assert (home / "daemon.sqlite").is_file()
    assert not (cwd / "~").exists()


def test_a_service_state_under_home_in_a_config_file_is_in_home(tmp_path: Path) -> None:
    """``[service] state = "~/service.sqlite"``: ``serve`` kept its tasks in ``./~/`` of the
    directory it was started from; started from another, it knew none of them (every run's
    tasks forgotten, their rows sent again). The file is under ``$HOME``."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    for folder in (home, cwd):
        folder.mkdir()
    config = tmp_path / "svc.toml"
    config.write_text('[service]\nport = 0\nstate = "~/service.sqlite"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "fashiontag_pipeline", "serve", "--config", str(config)],
        env={**ENV, "HOME": str(home)},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"listening on ")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert (home / "service.sqlite").is_file()
    assert not (cwd / "~").exists()
