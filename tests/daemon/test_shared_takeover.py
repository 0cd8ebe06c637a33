"""Taking a manifest over on a shared PostgreSQL state, at the edges of an attempt.

Three ways a manifest whose rows were all tagged (or were being tagged) ended ``failed``, its
rows hidden in an epoch's file, so that dropping it again tagged and billed everything twice:

* its daemon was killed after publishing the outputs (the epoch's files renamed over
  ``results.jsonl``) and before settling the claim: the taker looked for the renamed file;
* attempts that each made progress and then stopped on the state (a database restarted or
  failed over several times over one long manifest) were counted as failures in a row;
* the daemon that takes it over mounts the shared outbox at another path than the one that
  wrote it: the taker opened the path the state recorded, as the writer saw it.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import fashiontag_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.helpers import short_deadline
from .helpers import DaemonProcess, read_lines, write_manifest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and unix sockets")

#: Loaded by a daemon at start (``sitecustomize``), on cue from its environment:
#: ``HOOK_KILL_AFTER_PUBLISH``: SIGKILL right after a manifest's outputs are published, before
#: its summary and claim are settled; ``HOOK_FAIL_PLAN=N,N,...``: the manifest's attempts (its
#: fenced state connections), in turn, stop on a state error after N commits (0: at their
#: first transaction, nothing committed); later attempts run on.
HOOK = textwrap.dedent(
    """
    import os, signal
    if os.environ.get("HOOK_KILL_AFTER_PUBLISH"):
        import fashiontag_pipeline.daemon.shared as shared
        _publish = shared.publish_outputs
        def publish_then_die(outputs, epoch):
            _publish(outputs, epoch)
            os.kill(os.getpid(), signal.SIGKILL)
        shared.publish_outputs = publish_then_die
    if os.environ.get("HOOK_FAIL_PLAN"):
        from fashiontag_pipeline import _exceptions as exc
        from fashiontag_pipeline.engine.state import pgstore
        plan = [int(n) for n in os.environ["HOOK_FAIL_PLAN"].split(",")]
        cls = pgstore.PostgresStateDB
        _init, _begin, _commit = cls.__init__, cls.begin, cls.commit
        def init(self, *args, **kwargs):
            _init(self, *args, **kwargs)
            fenced = kwargs.get("fence") is not None
            self.hook_after = plan.pop(0) if fenced and plan else None
            self.hook_commits = 0
        def begin(self):
            if self.hook_after == 0:
                raise exc.StateError("hook: the database went away")
            _begin(self)
        def commit(self):
            _commit(self)
            self.hook_commits += 1
            if self.hook_after and self.hook_commits >= self.hook_after:
                raise exc.StateError("hook: the database went away")
        cls.__init__, cls.begin, cls.commit = init, begin, commit
    """
)


def _hooked(tmp_path: Path, **env: str) -> dict[str, str]:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    # The package under test after the hook: sitecustomize runs before ``-m`` puts the
    # working folder on the path, so the hook would import whichever copy is installed.
    package = Path(fashiontag_pipeline.__file__).parents[1]
    return {"PYTHONPATH": os.pathsep.join([str(hook), str(package)]), **env}


def _drop(inbox: Path, name: str, ids: list[str]) -> None:
    inbox.mkdir(parents=True, exist_ok=True)
    tmp = inbox / f".{name}.part"
    tmp.write_bytes(write_manifest(Path(), ids))
    os.rename(tmp, inbox / name)


def _common(url: str, tmp_path: Path) -> list[str]:
    # (A stop or a kill with a create written ahead and never answered: the next attempt
    # looks for its task until a request's deadline has gone by since it was sent, here 3 s,
    # and list_lag, here 0.5 s: the reference service lists a task as soon as it is created.)
    return ["--state", url, "--lease", "2", "--max-active", "2", *short_deadline(tmp_path)]


def _ids_once(folder: Path, ids: list[str]) -> None:
    got = [r["id"] for r in read_lines(folder / "results.jsonl")]
    assert len(got) == len(set(got)), "an id was written twice"
    assert sorted(got) == sorted(ids)


async def test_a_daemon_killed_between_publishing_and_settling_is_taken_over_as_done(
    tmp_path: Path, postgres_url: str
) -> None:
    ids = [f"g{i}" for i in range(300)]
    async with running_service(ServiceConfig()) as svc:
        env = _hooked(tmp_path, HOOK_KILL_AFTER_PUBLISH="1")
        a = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path), env=env).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            _drop(a.inbox, "m.csv", ids)
            assert await a.wait_exit(timeout=60) == -9  # killed right after publishing
            assert len(read_lines(a.outbox / "m" / "results.jsonl")) == len(ids)
            b = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path)).start()
            summary = await b.wait_summary("m", timeout=90)
            assert await b.stop() == 0
        finally:
            a.ensure_dead()
            if b is not None:
                b.ensure_dead()
    assert summary["status"] == "done", summary.get("reason")
    assert summary["tagged"] == len(ids)
    _ids_once(tmp_path / "outbox" / "m", ids)
    assert (tmp_path / "inbox" / "done" / "m.csv").exists()
    assert not list((tmp_path / "outbox" / "m").glob(".re*.e*.jsonl"))


async def _attempts_planned(
    tmp_path: Path, postgres_url: str, plan: str, ids: list[str]
) -> tuple[dict[str, Any], list[int]]:
    """One daemon tags manifest ``m.csv`` while its attempts stop as ``HOOK_FAIL_PLAN`` says:
    its summary, and the attempt count each stop logged. Every id is checked once."""
    async with running_service(ServiceConfig(rate=1500.0)) as svc:
        env = _hooked(tmp_path, HOOK_FAIL_PLAN=plan)
        a = DaemonProcess(tmp_path, svc.url, extra=_common(postgres_url, tmp_path), env=env).start()
        try:
            await a.wait_ready_endpoint()
            _drop(a.inbox, "m.csv", ids)
            summary = await a.wait_summary("m", timeout=180)
            assert await a.stop() == 0
        finally:
            a.ensure_dead()
    assert summary["status"] == "done", summary.get("reason")
    _ids_once(tmp_path / "outbox" / "m", ids)
    stopped = "the manifest stopped on an error; it resumes when it is leased again"
    return summary, [line["attempts"] for line in a.logs() if line.get("event") == stopped]


async def test_attempts_that_each_make_progress_do_not_add_up_to_a_failure(
    tmp_path: Path, postgres_url: str
) -> None:
    # Six attempts stop on the state after committing results, one more than a manifest may
    # fail in a row: each made progress, so none of them is the same failure again.
    ids = [f"r{i}" for i in range(8_000)]
    _, attempts = await _attempts_planned(tmp_path, postgres_url, "8,8,8,8,8,8", ids)
    assert len(attempts) == 6


async def test_an_attempt_that_makes_progress_after_four_that_made_none_is_not_the_fifth(
    tmp_path: Path, postgres_url: str
) -> None:
    # The fifth attempt in a row commits rows before it stops: its progress is seen when the
    # next one begins, so the count starts again there instead of failing the manifest.
    ids = [f"q{i}" for i in range(4_000)]
    _, attempts = await _attempts_planned(tmp_path, postgres_url, "0,0,0,0,8", ids)
    assert attempts == [1, 2, 3, 4, 5]


async def test_a_taker_that_mounts_the_share_elsewhere_finishes_the_manifest(
    tmp_path: Path, postgres_url: str
) -> None:
    # Machines A and B mount one share at two paths; B does not have A's.
    share = tmp_path / "share"
    share.mkdir()
    (tmp_path / "mnt_a").symlink_to(share)
    (tmp_path / "mnt_b").symlink_to(share)
    ids = [f"k{i}" for i in range(6_000)]
    folder = share / "outbox" / "big"
    async with running_service(ServiceConfig(rate=2500.0)) as svc:
        a = DaemonProcess(
            tmp_path / "mnt_a", svc.url, extra=_common(postgres_url, tmp_path)
        ).start()
        b: DaemonProcess | None = None
        try:
            await a.wait_ready_endpoint()
            _drop(a.inbox, "big.csv", ids)
            with anyio.fail_after(90):
                while not any(len(read_lines(p)) >= 1000 for p in folder.glob(".results.e*")):
                    a.check_alive()
                    await anyio.sleep(0.02)
            await a.kill()
            (tmp_path / "mnt_a").unlink()
            b = DaemonProcess(
                tmp_path / "mnt_b", svc.url, extra=_common(postgres_url, tmp_path)
            ).start()
            summary = await b.wait_summary("big", timeout=120)
            assert await b.stop() == 0
        finally:
            a.ensure_dead()
            if b is not None:
                b.ensure_dead()
    assert summary["status"] == "done", summary.get("reason")
    _ids_once(folder, ids)
